"""Hot routes served without FastAPI's per-request machinery.

FastAPI resolves a route's dependencies and header parameters on every request; under load
that took a tenth of the priority API's CPU (a py-spy profile at 400 P0 acceptances/s,
``docs/decisions/2026-12-06-direct-message-route.md``). A route listed here is also served by
a plain Starlette
:class:`~starlette.routing.Route` placed ahead of FastAPI's: the request reaches ``endpoint``
directly, which finds the runtime (``auth.get_runtime``) and the tenant (:func:`tenant_of`)
itself.

Contract: the FastAPI route stays (its signature, responses and body are what the OpenAPI
document states) and is never called for the path and methods served directly; ``endpoint``
must honour everything that signature declares (authentication, its header parameters).
``tests/unit/test_direct_routes.py`` holds both to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from fastapi import FastAPI, Request, Response
from starlette.routing import Route

from notiflow.gateway.auth import authenticate
from notiflow.gateway.runtime import Runtime
from notiflow.settings import TenantConfig

Endpoint = Callable[[Request], Awaitable[Response]]


async def tenant_of(request: Request, rt: Runtime) -> TenantConfig:
    """The authenticated tenant, as the ``Tenant`` dependency finds it (401 otherwise)."""
    return await authenticate(request, rt, None)


def serve_directly(app: FastAPI, path: str, endpoint: Endpoint,
                   methods: Sequence[str] = ("POST",)) -> Route:
    """Serve ``methods`` of ``path`` by ``endpoint`` ahead of every other route."""
    route = Route(path, endpoint, methods=list(methods), include_in_schema=False)
    app.router.routes.insert(0, route)
    return route
