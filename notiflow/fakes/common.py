"""Plumbing shared by the provider emulators: the common knobs, the records
(:class:`MessageRecord` in a bounded :class:`MessageLog`), the admin API
(``/_admin/{name}/config|messages|stats|reset``), a scheduled webhook dispatcher and small
response helpers. Knob names and record fields are those of ``docs/providers.md``."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import random
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, Generic, Literal, TypeVar

import aiohttp
import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


ACCEPTED: Final = "accepted"


@dataclass(slots=True)
class MessageRecord:
    """One request to an emulator's send endpoint, as the emulator saw it."""

    received_at: float
    outcome: str
    status: int
    error_code: int | None
    sid: str | None
    message_id: str | None
    attempt: int | None
    to: str | None
    from_: str | None
    body: str | None
    hang: bool = False
    """Accepted, then answered only after ``hang_s`` (the accepted-then-timeout case)."""

    @property
    def accepted(self) -> bool:
        return self.outcome == ACCEPTED

    def as_json(self) -> dict[str, Any]:
        """Every field, ``from_`` as ``from``, in the order declared: these, then those a
        provider's record adds."""
        return {key: getattr(self, name) for key, name in _json_keys(type(self))}


_JSON_KEYS: dict[type[MessageRecord], tuple[tuple[str, str], ...]] = {}


def _json_keys(record_type: type[MessageRecord]) -> tuple[tuple[str, str], ...]:
    """(JSON key, field name) of every field of ``record_type``."""
    keys = _JSON_KEYS.get(record_type)
    if keys is None:
        keys = _JSON_KEYS[record_type] = tuple(
            ("from" if f.name == "from_" else f.name, f.name) for f in fields(record_type))
    return keys


MAX_PREFIXES = 16


class MessageLog:
    """The newest ``max_records`` records, indexed by message_id, plus exact lifetime counters.

    ``duplicates`` and the per-message_id histogram cover the retained window only.
    """

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self.records: deque[MessageRecord] = deque()
        self.by_message_id: dict[str, list[MessageRecord]] = {}
        self.accepted_histogram: Counter[int] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.received = 0
        self.accepted = 0
        self.hung = 0
        self._prefixes: dict[str, int] = {}
        """Prefix asked for → retained message ids with it and an accepted request, kept up
        to date on every record once asked (benchmarks poll it every few seconds; a scan
        of every message id per poll stalled the emulators' loop under a flood)."""

    def accepted_with_prefix(self, prefix: str) -> int:
        """Retained message ids starting with ``prefix`` that have an accepted request."""
        if prefix not in self._prefixes:
            if len(self._prefixes) >= MAX_PREFIXES:
                self._prefixes.pop(next(iter(self._prefixes)))
            self._prefixes[prefix] = sum(
                1 for mid, recs in self.by_message_id.items()
                if mid.startswith(prefix) and any(r.accepted for r in recs))
        return self._prefixes[prefix]

    def _count_prefixes(self, mid: str, delta: int) -> None:
        for prefix in self._prefixes:
            if mid.startswith(prefix):
                self._prefixes[prefix] += delta

    def resize(self, max_records: int) -> None:
        """Retain at most ``max_records`` from now on, evicting the oldest at once."""
        self.max_records = max_records
        while len(self.records) > max_records:
            self._evict(self.records.popleft())

    def add(self, record: MessageRecord) -> None:
        if len(self.records) >= self.max_records:
            self._evict(self.records.popleft())
        self.records.append(record)
        self.received += 1
        self.outcomes[record.outcome] += 1
        if record.accepted:
            self.accepted += 1
            self.hung += record.hang
        mid = record.message_id
        if mid is None:
            return
        same = self.by_message_id.get(mid)
        if same is None:
            self.by_message_id[mid] = [record]
            self.accepted_histogram[int(record.accepted)] += 1
            if record.accepted:
                self._count_prefixes(mid, 1)
            return
        before = sum(r.accepted for r in same)
        same.append(record)
        if record.accepted:
            self.accepted_histogram[before] -= 1
            self.accepted_histogram[before + 1] += 1
            if before == 0:
                self._count_prefixes(mid, 1)

    def _evict(self, record: MessageRecord) -> None:
        mid = record.message_id
        if mid is None:
            return
        same = self.by_message_id[mid]
        before = sum(r.accepted for r in same)
        same.pop(0)
        self.accepted_histogram[before] -= 1
        if same:
            self.accepted_histogram[before - int(record.accepted)] += 1
        else:
            del self.by_message_id[mid]
        if before and before == int(record.accepted):
            self._count_prefixes(mid, -1)

    def find(self, *, message_id: str | None = None, sid: str | None = None,
             limit: int | None = None) -> list[MessageRecord]:
        """Matching records, oldest first; with ``limit``, only the newest ``limit``."""
        found: list[MessageRecord]
        if message_id is not None:
            found = self.by_message_id.get(message_id, [])
            if sid is not None:
                found = [r for r in found if r.sid == sid]
        elif sid is not None:
            found = [r for r in self.records if r.sid == sid]
        elif limit is not None:
            return list(itertools.islice(reversed(self.records), limit))[::-1]
        else:
            found = list(self.records)
        return found[-limit:] if limit is not None else list(found)

    def stats(self) -> dict[str, Any]:
        histogram = {str(k): v for k, v in sorted(self.accepted_histogram.items()) if v}
        return {
            "received": self.received,
            "accepted": self.accepted,
            "hung": self.hung,
            "rejected": self.received - self.accepted,
            "duplicates": sum(v for k, v in self.accepted_histogram.items() if k >= 2),
            "by_outcome": dict(self.outcomes),
            "by_message_id": {"distinct": len(self.by_message_id),
                              "accepted_histogram": histogram},
            "retained": len(self.records),
        }


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
    counted and logged (throttled), never raised or retried. Subclasses may batch due items
    (:meth:`_pop_due`) and count calls differently (:meth:`_count`)."""

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
            for url, item in self._pop_due():
                await self._slots.acquire()
                task = asyncio.create_task(self._call(url, item))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def _pop_due(self) -> list[tuple[str, W]]:
        """The calls to make now: the earliest due one."""
        _, _, url, item = heapq.heappop(self._heap)
        return [(url, item)]

    def _count(self, item: W, ok: bool) -> None:
        """Count one finished call."""
        self.counts["sent" if ok else "failed"] += 1

    async def _call(self, url: str, item: W) -> None:
        try:
            assert self._session is not None
            status = await self._deliver(self._session, url, item)
            ok, problem = 200 <= status < 300, f"HTTP {status}"
        except Exception as exc:
            ok, problem = False, f"{type(exc).__name__}: {exc}"
        finally:
            self._slots.release()
        self._count(item, ok)
        if ok:
            return
        now = time.monotonic()
        if now - self._last_failure_log >= 10.0:
            self._last_failure_log = now
            log.warning("%s webhook to %s failed (%s); %d failures so far", self.name,
                        url.split("?", 1)[0], problem, self.counts["failed"])


class Emulator(Generic[K]):
    """Knobs, records and the admin endpoints of one emulator named ``name``, and its webhook
    dispatcher ``callbacks`` if it has one (run by :meth:`lifecycle`, cleared by :meth:`reset`,
    counted under ``callbacks`` in ``/stats``)."""

    def __init__(self, name: str, knobs_type: type[K], *, rng: random.Random | None = None,
                 callbacks: WebhookDispatcher[Any] | None = None) -> None:
        self.name = name
        self._knobs_type = knobs_type
        self.knobs: K = knobs_type()
        self.messages = MessageLog(self.knobs.max_records)
        self.rng = rng or random.Random()
        self.callbacks = callbacks

    def admin_routes(self) -> list[web.RouteDef]:
        base = f"/_admin/{self.name}"
        return [
            web.get(f"{base}/config", self.get_config),
            web.post(f"{base}/config", self.set_config),
            web.get(f"{base}/messages", self.list_messages),
            web.get(f"{base}/stats", self.get_stats),
            web.post(f"{base}/reset", self.reset_handler),
        ]

    async def lifecycle(self, _app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx`` hook: runs the callback dispatcher while the app runs."""
        if self.callbacks is not None:
            await self.callbacks.start()
        yield
        if self.callbacks is not None:
            await self.callbacks.stop()

    def reset(self) -> None:
        """Forget every record, pending callback and knob (subclasses also clear their own
        state)."""
        self.knobs = self._knobs_type()
        self.messages = MessageLog(self.knobs.max_records)
        if self.callbacks is not None:
            self.callbacks.clear()

    def extra_stats(self) -> dict[str, Any]:
        """Emulator-specific additions to ``/stats``."""
        return {} if self.callbacks is None else {"callbacks": self.callbacks.stats()}

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
        unless ``limit`` (the newest ``limit``) is given; ``fields=a,b`` keeps only those keys
        (benchmarks fetch hundreds of thousands of records without their bodies)."""
        query = request.query
        try:
            limit = max(int(query["limit"]), 1) if "limit" in query else None
        except ValueError:
            return json_response(orjson.dumps({"error": "limit must be an integer"}), 400)
        found = self.messages.find(message_id=query.get("message_id"), sid=query.get("sid"),
                                   limit=limit)
        docs = [r.as_json() for r in found]
        if "fields" in query:
            keep = [f for f in query["fields"].split(",") if f]
            docs = [{k: d.get(k) for k in keep} for d in docs]
        return json_response(orjson.dumps(docs), 200)

    async def get_stats(self, request: web.Request) -> web.Response:
        """Counters; ``?prefix=`` adds ``accepted_with_prefix``: retained message ids with that
        prefix that have an accepted request (benchmarks count one workload's messages)."""
        doc = {**self.messages.stats(), **self.extra_stats()}
        prefix = request.query.get("prefix")
        if prefix:
            doc["accepted_with_prefix"] = self.messages.accepted_with_prefix(prefix)
        return json_response(orjson.dumps(doc), 200)

    async def reset_handler(self, _request: web.Request) -> web.Response:
        self.reset()
        return json_response(b'{"reset":true}', 200)
