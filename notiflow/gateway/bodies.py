"""Request bodies read within a limit, never buffered whole first.

Two layers keep what one request can make a process hold to a known size:

- :func:`read_limited`, which every route that reads a body calls with its own limit: a
  ``Content-Length`` over the limit is refused before a byte is read, a body (declared or
  chunked) is read chunk by chunk and refused as soon as it passes the limit, and a body that
  takes longer than :data:`BODY_TIMEOUT_S` to arrive is refused ``408``;
- :class:`BodyCeiling`, ASGI middleware in front of every route of the app: the same refusal
  for any body over the largest route limit, for routes that read no body or read it some
  other way.

A refusal closes the connection (``Connection: close``), so the rest of the body is not
read and thrown away.
"""

from __future__ import annotations

import asyncio
from typing import Final

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from notiflow.gateway.errors import ApiError

BODY_TIMEOUT_S: Final = 30.0
"""Longest a route waits for a whole body once it started reading it."""
CLOSE: Final = {"Connection": "close"}


def too_large(limit: int) -> ApiError:
    """``413 payload_too_large``; the connection is closed after it."""
    return ApiError(413, "payload_too_large", "body_too_large",
                    f"request bodies are limited to {limit} bytes", headers=dict(CLOSE))


def too_slow(timeout_s: float) -> ApiError:
    """``408 request_timeout``: the body did not arrive in time; the connection is closed."""
    return ApiError(408, "request_timeout", "body_too_slow",
                    f"the body must arrive within {timeout_s:g} s", headers=dict(CLOSE))


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The ``Content-Length`` of raw ASGI headers when it is a number, else None."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def over_limit(declared: str | None, limit: int) -> bool:
    """Whether a ``Content-Length`` header value declares more than ``limit`` bytes."""
    return declared is not None and declared.isdigit() and int(declared) > limit


async def read_limited(request: Request, limit: int,
                       timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The raw body: ``413`` once it exceeds ``limit`` bytes (declared, or as it streams in,
    after at most one chunk beyond the limit), ``408`` when it takes longer than
    ``timeout_s``."""
    if over_limit(request.headers.get("content-length"), limit):
        raise too_large(limit)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                if len(body) + len(chunk) > limit:
                    raise too_large(limit)
                body += chunk
    except TimeoutError:
        raise too_slow(timeout_s) from None
    return bytes(body)


class BodyCeiling:
    """ASGI middleware: no HTTP request body of more than ``limit`` bytes reaches the app.

    A ``Content-Length`` over ``limit`` is answered ``413`` before the app is called; a body
    that streams past it makes the app's next ``receive`` raise that ``413`` (the app's error
    handlers answer it)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope.get("headers", []))
        if declared is not None and declared > self.limit:
            await too_large(self.limit).response()(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large(self.limit)
            return message

        await self.app(scope, counted, send)
