"""What serving ``POST /v1/messages`` directly (``gateway/direct.py``) saves per request,
against the same request through FastAPI's route (dependencies and header parameters solved
per request).

``python -m notiflow.bench.route_overhead [N]`` needs no stack: it builds the API's app twice
(the direct route removed from the second), calls each in this process through ASGI with an
authenticated request whose body fails validation (``422``: authentication, the key's check,
the body read and parsed, the schema; no store reached), N times per round, alternating, and
prints microseconds per request. The development environment's settings fill what the
environment does not set.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import MutableMapping
from typing import Any

from fastapi import FastAPI
from starlette.routing import Route

from notiflow.devenv import dev_environment
from notiflow.gateway import messages
from notiflow.gateway.app import build_app
from notiflow.settings import Settings

ROUNDS = 3
BODY = json.dumps({"channel": "SMS", "tier": "P1", "recipient": {"phone": "+1415555"},
                   "template_id": "otp"}).encode()


def apps(settings: Settings) -> dict[str, FastAPI]:
    """The app as built, and one whose ``POST /v1/messages`` is FastAPI's route."""
    direct, routed = build_app(settings), build_app(settings)
    routed.router.routes[:] = [r for r in routed.router.routes if not (
        isinstance(r, Route) and r.endpoint is messages.send_message_directly)]
    return {"direct": direct, "fastapi route": routed}


async def per_request_us(app: FastAPI, token: str, n: int) -> tuple[float, set[int]]:
    """Mean microseconds per request over ``n`` calls, and the statuses answered."""
    headers = [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode()),
               (b"idempotency-key", b"bench-1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(BODY)).encode())]
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/messages", "raw_path": b"/v1/messages",
        "root_path": "", "query_string": b"", "headers": headers,
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
    statuses: set[int] = set()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.add(message["status"])

    started = time.perf_counter()
    for _ in range(n):
        await app(dict(scope), receive, send)
    return (time.perf_counter() - started) / n * 1e6, statuses


async def main(n: int) -> None:
    env, _ = dev_environment(api_port=1, fakes_port=2)
    os.environ.update({k: v for k, v in env.items() if k not in os.environ})
    settings = Settings()
    tenant = settings.tenant("acme")
    if tenant is None or tenant.token is None:
        raise SystemExit("the development tenant acme has no token")
    token = tenant.token.get_secret_value()
    built = apps(settings)
    for app in built.values():
        await per_request_us(app, token, n // 10)
    for round_no in range(1, ROUNDS + 1):
        for name, app in built.items():
            us, statuses = await per_request_us(app, token, n)
            print(f"round {round_no}  {name:<14} {us:7.1f} µs/request  answers {sorted(statuses)}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000))
