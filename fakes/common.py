"""Plumbing shared by the SendGrid, FCM, Vonage and SMTP emulators: the common knobs, the admin
API (``/_admin/{name}/config|messages|stats|reset``) over a :class:`MessageLog`, a scheduled
webhook dispatcher and small response helpers. Knob names and record fields match the Twilio
emulator's (``docs/providers.md``)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Generic, Literal, TypeVar

import aiohttp
import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from notiflow.fakes.twilio import MessageLog

log = logging.getLogger(__name__)


class BaseKnobs(BaseModel):
    """Runtime behaviour every emulator shares (the SMTP one included); each field can be
    changed over the admin API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_ms: float = Field(0.0, ge=0)
    """Mean added response latency."""
    latency_jitter_ms: float = Field(0.0, ge=0)
    """Latency is uniform in ``latency_ms ± latency_jitter_ms`` (never below 0)."""
    outage: bool = False
    """Every send refused as unavailable (HTTP 503), before authentication."""
    timeout_rate: float = Field(0.0, ge=0, le=1)
    """Share of valid sends accepted (recorded) but answered only after ``hang_s``."""
    hang_s: float = Field(30.0, ge=0, le=3600)
    max_records: int = Field(1_000_000, ge=1, le=20_000_000)
    """Records retained (oldest evicted first)."""


class CommonKnobs(BaseKnobs):
    """The knobs of the HTTP emulators: :class:`BaseKnobs` plus the HTTP error mix."""

    error_rate_5xx: float = Field(0.0, ge=0, le=1)
    """Share of authenticated requests answered with a status drawn from ``statuses_5xx``."""
    statuses_5xx: tuple[Literal[500, 503], ...] = Field((500, 503), min_length=1)
    error_rate_429: float = Field(0.0, ge=0, le=1)
    """Share of authenticated requests answered 429 (wait given by ``retry_after_s``)."""
    retry_after_s: float = Field(1.0, ge=0)


K = TypeVar("K", bound=BaseKnobs)


def json_response(body: bytes, status: int,
                  headers: Mapping[str, str] | None = None) -> web.Response:
    """An ``application/json`` response of already-encoded ``body``."""
    return web.Response(body=body, status=status, content_type="application/json",
                        headers=headers)


def retry_after_text(seconds: float) -> str:
    """``Retry-After`` delta-seconds: an integer where possible."""
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


W = TypeVar("W")

Deliver = Callable[[aiohttp.ClientSession, str, W], Awaitable[int]]
"""(session, url, item) → HTTP status of one webhook call; may raise."""


class WebhookDispatcher(Generic[W]):
    """Makes scheduled webhook calls at their due time with bounded concurrency and a bounded
    backlog (more are dropped and counted). Failures (an exception or a non-2xx answer) are
    counted and logged (throttled), never raised or retried."""

    def __init__(self, name: str, deliver: Deliver[W], *, user_agent: str,
                 concurrency: int = 64, max_pending: int = 200_000) -> None:
        self.name = name
        self._deliver = deliver
        self._user_agent = user_agent
        self._heap: list[tuple[float, int, str, W]] = []
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(concurrency)
        self._max_pending = max_pending
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_failure_log = -1e9
        self.counts: Counter[str] = Counter()

    def schedule(self, due: float, url: str, item: W) -> None:
        """Queue one call for ``due`` (``time.monotonic`` seconds)."""
        if len(self._heap) >= self._max_pending:
            self.counts["dropped"] += 1
            return
        entry = (due, next(self._seq), url, item)
        heapq.heappush(self._heap, entry)
        self.counts["scheduled"] += 1
        if self._heap[0] is entry:
            self._wakeup.set()

    def clear(self) -> None:
        self._heap.clear()
        self.counts.clear()

    def stats(self) -> dict[str, int]:
        return {"scheduled": self.counts["scheduled"], "sent": self.counts["sent"],
                "failed": self.counts["failed"], "dropped": self.counts["dropped"],
                "pending": len(self._heap)}

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=5.0),
            headers={"User-Agent": self._user_agent},
        )
        self._runner = asyncio.create_task(self._run(), name=f"{self.name}-webhooks")

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            if not self._heap:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            delay = self._heap[0][0] - time.monotonic()
            if delay > 0:
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                continue
            _, _, url, item = heapq.heappop(self._heap)
            await self._slots.acquire()
            task = asyncio.create_task(self._call(url, item))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _call(self, url: str, item: W) -> None:
        try:
            assert self._session is not None
            status = await self._deliver(self._session, url, item)
            ok, problem = 200 <= status < 300, f"HTTP {status}"
        except Exception as exc:
            ok, problem = False, f"{type(exc).__name__}: {exc}"
        finally:
            self._slots.release()
        if ok:
            self.counts["sent"] += 1
            return
        self.counts["failed"] += 1
        now = time.monotonic()
        if now - self._last_failure_log >= 10.0:
            self._last_failure_log = now
            log.warning("%s webhook to %s failed (%s); %d failures so far", self.name,
                        url.split("?", 1)[0], problem, self.counts["failed"])


class Emulator(Generic[K]):
    """Knobs, records and the admin endpoints of one emulator named ``name``."""

    def __init__(self, name: str, knobs_type: type[K], *,
                 rng: random.Random | None = None) -> None:
        self.name = name
        self._knobs_type = knobs_type
        self.knobs: K = knobs_type()
        self.messages = MessageLog(self.knobs.max_records)
        self.rng = rng or random.Random()

    def admin_routes(self) -> list[web.RouteDef]:
        base = f"/_admin/{self.name}"
        return [
            web.get(f"{base}/config", self.get_config),
            web.post(f"{base}/config", self.set_config),
            web.get(f"{base}/messages", self.list_messages),
            web.get(f"{base}/stats", self.get_stats),
            web.post(f"{base}/reset", self.reset_handler),
        ]

    def reset(self) -> None:
        """Forget every record and knob (subclasses also clear their own state)."""
        self.knobs = self._knobs_type()
        self.messages = MessageLog(self.knobs.max_records)

    def extra_stats(self) -> dict[str, Any]:
        """Emulator-specific additions to ``/stats``."""
        return {}

    def knobs_changed(self) -> None:
        """Hook run after the knobs changed over the admin API."""

    async def added_latency(self, knobs: K) -> None:
        """Sleep for the configured latency (uniform in mean ± jitter)."""
        if knobs.latency_ms or knobs.latency_jitter_ms:
            jitter = knobs.latency_jitter_ms
            delay = knobs.latency_ms + (self.rng.uniform(-jitter, jitter) if jitter else 0.0)
            if delay > 0:
                await asyncio.sleep(delay / 1000)

    def draw(self, rate: float) -> bool:
        """True with probability ``rate``."""
        return bool(rate) and self.rng.random() < rate

    async def get_config(self, _request: web.Request) -> web.Response:
        return json_response(orjson.dumps(self.knobs.model_dump()), 200)

    async def set_config(self, request: web.Request) -> web.Response:
        """Merge the given knobs into the current ones; 400 (nothing changed) if invalid."""
        try:
            patch = orjson.loads(await request.read())
            if not isinstance(patch, dict):
                raise ValueError("body must be a JSON object")
            knobs = self._knobs_type.model_validate({**self.knobs.model_dump(), **patch})
        except (ValueError, ValidationError) as exc:
            return json_response(orjson.dumps({"error": str(exc)}), 400)
        self.knobs = knobs
        if knobs.max_records != self.messages.max_records:
            self.messages.resize(knobs.max_records)
        self.knobs_changed()
        log.info("%s emulator knobs: %s", self.name, knobs.model_dump())
        return json_response(orjson.dumps(knobs.model_dump()), 200)

    async def list_messages(self, request: web.Request) -> web.Response:
        """Retained records, oldest first, filtered by ``message_id`` and/or ``sid``; all of them
        unless ``limit`` (the newest ``limit``) is given."""
        query = request.query
        try:
            limit = max(int(query["limit"]), 1) if "limit" in query else None
        except ValueError:
            return json_response(orjson.dumps({"error": "limit must be an integer"}), 400)
        found = self.messages.find(message_id=query.get("message_id"), sid=query.get("sid"),
                                   limit=limit)
        return json_response(orjson.dumps([r.as_json() for r in found]), 200)

    async def get_stats(self, _request: web.Request) -> web.Response:
        return json_response(orjson.dumps({**self.messages.stats(), **self.extra_stats()}), 200)

    async def reset_handler(self, _request: web.Request) -> web.Response:
        self.reset()
        return json_response(b'{"reset":true}', 200)
