"""Access lines and server-span URLs that name the route, never the request's path.

A path carries what a tenant put in it: a recipient (``/v1/recipients/%2B4179…/preferences``,
``…/j.doe%40example.com/…``), a device token, an inbox user. So the API logs and traces a
request by its route template (``/v1/recipients/{recipient}/devices/{token}``) and never by
its path or query string; a path no route serves is :data:`UNMATCHED`.

- :func:`route_template`: the template of the route that served (or would serve) a scope.
- :class:`AccessLog`: ASGI middleware writing one line per request on ``notiflow.access``,
  replacing uvicorn's access log (``gateway/app.py`` turns that one off).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from fastapi.routing import iter_route_contexts
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNMATCHED: Final = "<unmatched>"
"""What stands for a path no route serves."""
METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"})

access_log = logging.getLogger("notiflow.access")


def _template_of(route: Any) -> str | None:
    for attr in ("path_format", "path"):
        value = getattr(route, attr, None)
        if isinstance(value, str) and value:
            return value
    return None


def route_template(scope: Mapping[str, Any]) -> str:
    """The template of the route serving ``scope`` (``scope["route"]`` once routed, else the
    first of the app's routes matching path and method, else one matching the path only);
    :data:`UNMATCHED` when none does. Never any part of the path itself."""
    routed = _template_of(scope.get("route"))
    if routed is not None:
        return routed
    router = getattr(scope.get("app"), "router", None)
    routes = getattr(router, "routes", None)
    if not routes or scope.get("type") not in ("http", "websocket"):
        return UNMATCHED
    partial: str | None = None
    for route in iter_route_contexts(routes):
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return _template_of(route) or UNMATCHED
        if match is Match.PARTIAL and partial is None:
            partial = _template_of(route)
    return partial or UNMATCHED


def method_of(scope: Mapping[str, Any]) -> str:
    """The request method, or ``_OTHER`` for one outside :data:`METHODS`."""
    method = str(scope.get("method") or "")
    return method if method in METHODS else "_OTHER"


def client_of(scope: Mapping[str, Any]) -> str:
    """``host:port`` of the peer, ``-`` when unknown."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


def log_request(scope: Mapping[str, Any], status: int, duration_s: float) -> None:
    """One access line for a finished request, by route template."""
    route = route_template(scope)
    ms = round(duration_s * 1000, 1)
    access_log.info('%s - "%s %s HTTP/%s" %d %.1fms', client_of(scope), method_of(scope),
                    route, scope.get("http_version", "1.1"), status, ms,
                    extra={"http_route": route, "http_status": status, "duration_ms": ms})


class AccessLog:
    """ASGI middleware: after each HTTP request, :func:`log_request` with the status sent
    (500 when the app raised before sending one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            log_request(scope, status or 500, time.perf_counter() - started)
