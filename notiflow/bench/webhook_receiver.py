"""A client's webhook endpoint for tests and ``notiflow chaos``: an aiohttp server on a free
loopback port (own thread and event loop) that verifies every Standard Webhooks signature (a
request that fails verification is answered 401 and never counts as seen), records every
request, and answers as a caller-supplied behaviour says (status code, a hang, or refused
connections for a while)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson
from aiohttp import web
from pydantic import SecretStr

from notiflow.adapters.client_webhooks import WebhookVerificationError, verify
from notiflow.devenv import free_port

Behaviour = Callable[["Hit"], Awaitable[int]]
"""Given a request (``n`` = how many requests this webhook-id has had, this one included),
the status code to answer (it may sleep first)."""


@dataclass(frozen=True, slots=True)
class Hit:
    """One received request."""

    webhook_id: str
    n: int
    path: str
    timestamp: int
    body: dict[str, Any]
    valid: bool
    error: str | None
    received_at: float
    raw: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def message_id(self) -> str:
        return str(self.body.get("data", {}).get("message_id", ""))

    @property
    def status(self) -> str:
        return str(self.body.get("data", {}).get("status", ""))


@dataclass(frozen=True, slots=True)
class Answered:
    hit: Hit
    code: int
    answered_at: float


async def ok(hit: Hit) -> int:
    return 200


class Receiver:
    """``with Receiver(secrets) as r: ... r.url("/hook")``."""

    def __init__(self, secrets: Sequence[str | SecretStr], behaviour: Behaviour = ok,
                 tolerance: timedelta = timedelta(minutes=5), *,
                 require_each: bool = False) -> None:
        """``require_each``: a request is valid only if it carries a valid signature for
        every one of ``secrets`` (a rotation in progress), not just for one of them."""
        self.secrets = list(secrets)
        self.require_each = require_each
        self.behaviour = behaviour
        self.tolerance = tolerance
        self.port = free_port()
        self.answers: list[Answered] = []
        self.counts: Counter[str] = Counter()
        self.in_flight = 0
        self.peak = 0
        """Most requests handled at once."""
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"webhook-receiver-{self.port}")
        self._runner: web.AppRunner | None = None

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        self._call(self._listen())
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True).start()
        self._runner = runner

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def refuse_for(self, seconds: float) -> None:
        """Close the listener and every open connection, listen again after ``seconds``
        (connections meanwhile are refused). From a behaviour, start it as a task (it waits
        for running handlers); from a test, use :meth:`refuse_now`."""
        await self._close()
        await asyncio.sleep(seconds)
        await self._listen()

    def refuse_now(self, seconds: float) -> None:
        asyncio.run_coroutine_threadsafe(self.refuse_for(seconds), self._loop)

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        headers = dict(request.headers)
        error: str | None = None
        try:
            for held in ([[x] for x in self.secrets] if self.require_each
                         else [self.secrets]):
                verify(held, headers, raw, self.tolerance)
        except WebhookVerificationError as exc:
            error = str(exc)
        wid = request.headers.get("webhook-id", "")
        with self._lock:
            self.counts[wid] += 1
            n = self.counts[wid]
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = {}
        ts = request.headers.get("webhook-timestamp", "0")
        hit = Hit(wid, n, request.path, int(ts) if ts.isdigit() else 0, body, error is None,
                  error, time.time(), raw, tuple(headers.items()))
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            code = 401 if error else await self.behaviour(hit)
        finally:
            with self._lock:
                self.in_flight -= 1
        with self._lock:
            self.answers.append(Answered(hit, code, time.time()))
        return web.Response(status=code)

    # views

    @property
    def hits(self) -> list[Hit]:
        with self._lock:
            return [a.hit for a in self.answers]

    def delivered(self) -> list[Hit]:
        """Requests answered 2xx, in the order they were answered."""
        with self._lock:
            return [a.hit for a in sorted(self.answers, key=lambda a: a.answered_at)
                    if 200 <= a.code <= 299]

    def seen(self) -> set[tuple[str, str]]:
        """(message_id, status) of every validly signed request answered 2xx."""
        return {(h.message_id, h.status) for h in self.delivered() if h.valid}

    def first_deliveries(self, message_id: str) -> list[str]:
        """Statuses of ``message_id`` in the order of their first 2xx answer."""
        seen: list[str] = []
        for h in self.delivered():
            if h.message_id == message_id and h.status not in seen:
                seen.append(h.status)
        return seen
