"""Asynchronous sending: a per-process dispatcher and the keyed Bytewax logic that feeds it.

The dataflow never waits for a provider. :class:`SendLogic` (a ``StatefulBatchLogic`` keyed by
``{channel}:{shard}``) hands each message to the process's :class:`Dispatcher` and returns the
outcomes that have completed; a short timer collects the rest. Messages in flight are part of
the logic's snapshot, so an epoch can commit while they are in flight and a crash resubmits
them (the dedup lease decides whether they are sent again).

Per channel, the dispatcher bounds the calls in flight (``max_in_flight``) and the messages
waiting (``max_queued``); a channel at its bound raises its :class:`ChannelPressure` signal
and only that channel's source partitions pause. A slow or broken SMS provider therefore
never holds up email or push of the same tier.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import hashlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import orjson
from bytewax.operators import StatefulBatchLogic
from opentelemetry import trace
from opentelemetry.metrics import Observation

from notiflow import names, stages, telemetry, tuning
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.ports import STORE_DOWN, OpenSendPorts, SendPorts, Verdict
from notiflow.adapters.pressure import REPORT_EVERY_S, LatencyWindow
from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.redis_dedup import LeaseState
from notiflow.adapters.worker import loop_thread, register
from notiflow.flows.caps import LocalCaps, cap_check
from notiflow.flows.model import Out, Retry, Work
from notiflow.flows.policy import RetryPolicy
from notiflow.flows.routing import Choice, Unavailable, rank_routes, reserve
from notiflow.flows.steps import (
    Clock,
    dead_letter,
    is_expired,
    retry_record,
    scaled_lease_ttl,
    status_event,
)
from notiflow.flows.yielding import Slots, YieldWindow
from notiflow.names import Stage
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord, IngestRecord, StatusEvent
from notiflow.schemas.preferences import Suppression, state_key
from notiflow.schemas.status import rank
from notiflow.settings import Settings, TierPolicy
from notiflow.telemetry import header_traceparent

log = logging.getLogger(__name__)
T = TypeVar("T")

INFRA_RETRY_FOR = timedelta(seconds=60)
REDIS_PAUSE_S = 0.5
REDIS_CLOSED_WAIT_S = 30.0
BACKLOG_REPORT_S = 1.0
POLL = timedelta(milliseconds=5)
STALE_MARGIN = timedelta(seconds=2)
CRASH_MEMORY = timedelta(days=7)


class InfraUnavailable(RuntimeError):
    """Kafka, Cassandra or Redis stayed unavailable: the flow stops, no record is to blame."""


def crash_field(work: Work) -> str:
    """What a crash is counted against: the message's attempt. Not the source offset alone: a
    record that waits (backoff, a stale lease) is re-published at a new offset."""
    return f"{work.message_id}:{work.record.attempt}"


def content_fingerprint(work: Work) -> str:
    """Same recipient, channel, template, version and variables → same fingerprint (the
    tenant is part of the Redis key)."""
    r = work.record
    doc = orjson.dumps(
        [r.recipient_key(), r.channel.value, r.template_id, r.template_version, r.variables],
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(doc).hexdigest()


def lease_outcome(ev: StatusEvent, follow: Iterable[Out] = ()) -> dict[str, object]:
    """What a finished lease records, so a replay can re-emit the outcome and what follows
    it (the retry or check record, the dead letter) exactly as the first run emitted them."""
    done: dict[str, object] = {"status": ev.status.value, "reason": ev.reason}
    if ev.attempt_detail is not None:
        done["detail"] = ev.attempt_detail.model_dump(mode="json")
    if ev.next_attempt_at is not None:
        done["next_attempt_at"] = ev.next_attempt_at.isoformat()
    for out in follow:
        if isinstance(out, Retry):
            done["retry"] = out.record.model_dump(mode="json", exclude_none=True)
        elif isinstance(out, DlqRecord):
            done["dlq"] = out.model_dump(mode="json", exclude_none=True)
    return done


def attempt_detail(work: Work, result: SendResult) -> AttemptRecord:
    return AttemptRecord(
        attempt_no=work.record.attempt,
        provider_id=result.provider_id,
        outcome=result.outcome.value,
        provider_message_id=result.provider_message_id,
        normalized_error=result.reason,
        error_code=result.error_code,
        retry_after_s=result.retry_after_s,
        started_at=result.started_at,
        completed_at=result.completed_at,
    )


@dataclass(frozen=True, slots=True)
class RenderFailure:
    """The renderer broke an invariant (not a missing variable): a DLQ case, not FAILED."""

    reason: str


class ChannelPressure:
    """In-process signal shared by the dispatcher (writer) and the sources (readers): how many
    messages of each channel are waiting or in flight, against a bound."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.share = 1.0
        """Of ``bound`` currently allowed: a bulk flow yielding to P0 takes in less."""
        self._lock = threading.Lock()
        self._waiting: dict[Channel, int] = dict.fromkeys(Channel, 0)

    def add(self, channel: Channel, n: int = 1) -> None:
        with self._lock:
            self._waiting[channel] += n

    def done(self, channel: Channel, n: int = 1) -> None:
        with self._lock:
            self._waiting[channel] -= n

    def waiting(self, channel: Channel) -> int:
        return self._waiting[channel]

    def paused(self, channel: Channel) -> bool:
        return self._waiting[channel] >= max(1, self.bound * self.share)


def attempt_outcome(result: SendResult) -> str:
    """``outcome`` of ``notiflow.send.attempts``: the provider outcome, or ``rate_limited``."""
    return "rate_limited" if result.reason == "rate_limited" else result.outcome.value


def error_type(result: SendResult) -> str | None:
    """``error.type`` of a failed provider call (``timeout``, ``connection``, ``429``,
    ``4xx``, ``5xx``); None when it was accepted or the failure was ours."""
    reason = result.reason or ""
    if result.outcome is Outcome.ACCEPTED or reason.startswith("internal_error"):
        return None
    if reason in ("timeout", "connect_timeout"):
        return "timeout"
    if reason in ("connect_error", "connection_lost", "transport_error", "client_error"):
        return "connection"
    if reason == "rate_limited":
        return "429"
    return "4xx" if result.outcome is Outcome.PERMANENT else "5xx"


class _SendMetrics:
    """The send path's instruments (``notiflow/names.py``), created once per process."""

    def __init__(self) -> None:
        m = telemetry.meter()
        self.attempts = names.SEND_ATTEMPTS.create(m)
        self.request_duration = names.PROVIDER_REQUEST_DURATION.create(m)
        self.errors = names.PROVIDER_ERRORS.create(m)
        self.accept_to_provider = names.ACCEPT_TO_PROVIDER.create(m)
        self.retries = names.RETRIES_SCHEDULED.create(m)
        self.breaker_transitions = names.BREAKER_TRANSITIONS.create(m)
        names.QUEUE_OLDEST_AGE.create(m, callbacks=[_observe_oldest])
        names.BREAKER_STATE.create(m, callbacks=[_observe_breakers])
        names.PROVIDER_ROUTE_WEIGHT.create(m, callbacks=[_observe_weights])
        names.BULK_WINDOW.create(m, callbacks=[_observe_window])
        names.P0_WORST_LATENCY.create(m, callbacks=[_observe_p0_worst])

    def provider_call(self, span: Any, w: Work, result: SendResult, elapsed_s: float) -> None:
        """Count one provider call and describe it on its span."""
        outcome = attempt_outcome(result)
        channel = w.record.channel.value
        self.attempts.add(1, {"tier": w.record.tier.value, "channel": channel,
                              "provider": result.provider_id, "outcome": outcome})
        self.request_duration.record(elapsed_s, {"provider": result.provider_id,
                                                 "channel": channel, "outcome": outcome})
        kind = error_type(result)
        if kind is not None:
            self.errors.add(1, {"provider": result.provider_id, "channel": channel,
                                "error.type": kind})
        if span.is_recording():
            span.set_attribute(names.ATTR_OUTCOME, outcome)
            code = result.error_code or ""
            if code.startswith("http_") and code[5:].isdigit():
                span.set_attribute("http.response.status_code", int(code[5:]))
            if kind is not None:
                span.set_attribute("error.type", kind)


_live: weakref.WeakSet[Dispatcher] = weakref.WeakSet()
"""The dispatchers of this process (observed by the gauges below)."""
_STATE_CODE = {"closed": 0, "half_open": 1, "open": 2}


def _observe_oldest(options: Any) -> Iterable[Observation]:
    """``notiflow.queue.oldest_age`` per tier and channel: now - ``accepted_at`` of the
    oldest message a dispatcher holds (waiting or in flight), 0 when none."""
    now = time.time()
    for d in list(_live):
        oldest: dict[tuple[Tier, Channel], float] = {}
        for tier, at, channel in list(d._oldest.values()):
            key = (tier, channel)
            oldest[key] = min(oldest.get(key, at), at)
        for tier in {d.tier} | {t for t, _ in oldest}:
            for channel in Channel:
                first = oldest.get((tier, channel))
                yield Observation(0.0 if first is None else max(0.0, now - first),
                                  {"tier": tier.value, "channel": channel.value})


def _observe_breakers(options: Any) -> Iterable[Observation]:
    """``notiflow.breaker.state`` per provider account this process sends through."""
    for d in list(_live):
        res = d._ports
        if res is not None:
            for provider_id in list(res.providers):
                state = res.breakers.state(provider_id)
                yield Observation(_STATE_CODE.get(str(state.value), 0),
                                  {"provider": provider_id, "lane": d.policy.lane})


def _observe_weights(options: Any) -> Iterable[Observation]:
    """``notiflow.provider.route_weight`` per provider account this process sends through."""
    for d in list(_live):
        res = d._ports
        if res is not None:
            for provider_id in list(res.providers):
                yield Observation(res.breakers.weight(provider_id), {"provider": provider_id})


def _observe_window(options: Any) -> Iterable[Observation]:
    """``notiflow.bulk.window`` of each bulk-lane dispatcher."""
    for d in list(_live):
        if d.policy.lane == "bulk":
            yield Observation(d.window.limit / d.window.ceiling, {"tier": d.tier.value})


def _observe_p0_worst(options: Any) -> Iterable[Observation]:
    """``notiflow.p0.worst_latency`` of the P0 dispatcher (what it reports)."""
    for d in list(_live):
        if d.tier is Tier.P0 and d.reported is not None:
            yield Observation(d.reported, {"tier": Tier.P0.value})


_metrics = _SendMetrics()


class Dispatcher:
    """Performs every send of this process on one background event loop.

    Thread-safe :meth:`submit`; outcomes are delivered through ``concurrent.futures`` so the
    Bytewax worker thread never blocks on I/O.
    """

    def __init__(self, settings: Settings, tier: Tier, policy: TierPolicy, cipher: DlqCipher,
                 pressure: ChannelPressure, clock: Clock, open_ports: OpenSendPorts,
                 owner: str, rng: random.Random | None = None, source: str | None = None,
                 workers: int = 1) -> None:
        self.settings = settings
        self.tier = tier
        self.policy = policy
        self.cipher = cipher
        self.pressure = pressure
        self.clock = clock
        self.rng = rng or random.Random()
        self.source = source or f"send.{tier.value.lower()}"
        self.workers = workers
        self.owner = owner
        self._open_ports = open_ports
        self.content_window = settings.scaled(settings.content_dedup_window)
        self.redis_ok = True
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._ports: SendPorts | None = None
        self._sems: dict[Channel, Slots] = {}
        self._p0_latencies = LatencyWindow()
        self.reported: float | None = None
        self.window = YieldWindow(settings.bulk_yield, settings.policy(Tier.P0).sla
                                  .total_seconds(), policy.max_in_flight)
        """The bulk lane's in-flight window per channel (``flows/yielding.py``)."""
        self._retry_sems: dict[Channel, asyncio.Semaphore] = {}
        self._crashes: dict[str, int] = {}
        self._templates: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._oldest: dict[str, tuple[Tier, float, Channel]] = {}
        self._local_caps = LocalCaps(share=workers)
        register(self)
        _live.add(self)

    @property
    def ports(self) -> SendPorts:
        """The opened ports (the loop opens them before it runs any batch)."""
        if self._ports is None:
            raise RuntimeError("dispatcher ports are not open")
        return self._ports

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> asyncio.AbstractEventLoop:
        """Start the loop thread and begin opening clients in the background (idempotent).
        The flow calls this when it is built, so the first P0 message finds a warm sender."""
        with self._lock:
            if self._loop is None:
                loop, self._thread = loop_thread(f"dispatch-{self.source}")
                self._opened = asyncio.run_coroutine_threadsafe(self._open(), loop)
                asyncio.run_coroutine_threadsafe(self._report_backlog(), loop)
                if self.tier is Tier.P0:
                    asyncio.run_coroutine_threadsafe(self._report_pressure(), loop)
                elif self.policy.lane == "bulk":
                    asyncio.run_coroutine_threadsafe(self._follow_pressure(), loop)
                self._loop = loop
            return self._loop

    async def _open(self) -> None:
        self._ports = ports = await self._open_ports()
        ports.breakers.on_change(self._breaker_changed)
        try:
            self._crashes = await ports.leases.crashes(self.source)
        except STORE_DOWN as exc:
            log.warning("crash counts not read: %r", exc)
        self._sems = {c: Slots(self.policy.max_in_flight) for c in Channel}
        retry_slots = max(1, int(self.policy.max_in_flight * self.settings.retry_share))
        self._retry_sems = {c: asyncio.Semaphore(retry_slots) for c in Channel}
        tuning.settle()
        log.info("dispatcher ready: providers %s", ", ".join(sorted(ports.providers)) or
                 "none")

    def _breaker_changed(self, change: Any) -> None:
        log.warning("circuit breaker %s", change)
        if change.shared:
            _metrics.breaker_transitions.add(1, {
                "provider": change.provider_id, "lane": change.lane or "priority",
                "from": change.old.value, "to": change.new.value,
                "why": change.why.split(":", 1)[0]})

    def close(self) -> None:
        """Stop the loop and release clients (pending sends are abandoned: they are in the
        flow's snapshot and resume on restart)."""
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            me = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not me:
                    task.cancel()
            if self._ports is not None:
                await self._ports.close()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=10)
        except Exception as exc:
            log.warning("dispatcher shutdown: %r", exc)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop = None

    # ------------------------------------------------------------------ submission

    def submit(self, batch: list[Work]) -> list[concurrent.futures.Future[list[Out]]]:
        """Start sending ``batch``; one future per message, resolving to its outputs."""
        loop = self.start()
        futures: list[concurrent.futures.Future[list[Out]]] = [
            concurrent.futures.Future() for _ in batch]
        for w in batch:
            self.pressure.add(w.record.channel)
            self._oldest[f"{w.message_id}:{w.record.attempt}"] = (w.record.tier,
                                                                  w.accepted_at.timestamp(),
                                                                  w.record.channel)
        submitted = time.time()
        loop.call_soon_threadsafe(lambda: loop.create_task(self._batch(batch, futures,
                                                                       submitted)))
        return futures

    def _resolve(self, w: Work, fut: concurrent.futures.Future[list[Out]],
                 outs: list[Out] | BaseException) -> None:
        self.pressure.done(w.record.channel)
        self._oldest.pop(f"{w.message_id}:{w.record.attempt}", None)
        if fut.done():
            return
        if isinstance(outs, BaseException):
            fut.set_exception(outs)
        else:
            fut.set_result(outs)

    async def _report_pressure(self) -> None:
        """P0's worst latency (completed in the last second, or held now) for the bulk lane
        to yield by (``adapters/pressure.py``)."""
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            res = self._ports
            if res is None:
                continue
            now = time.time()
            held = [at for tier, at, _ in list(self._oldest.values()) if tier is Tier.P0]
            worst = self._p0_latencies.worst(now - min(held) if held else None)
            self.reported = worst
            if worst is None:
                continue
            with contextlib.suppress(*STORE_DOWN):
                await res.boards.report_p0_worst(worst)

    async def _follow_pressure(self) -> None:
        """Bulk lane: resize every channel's in-flight slots by P0's latency signal; no
        signal (Redis down, no P0 traffic) counts as calm."""
        tick = self.settings.bulk_yield.tick.total_seconds()
        while True:
            await asyncio.sleep(tick)
            res = self._ports
            if res is None:
                continue
            try:
                worst = await res.boards.p0_worst()
            except STORE_DOWN:
                worst = None
            limit = self.window.step(worst)
            self.pressure.share = limit / self.window.ceiling
            for slots in self._sems.values():
                slots.resize(limit)

    async def _report_backlog(self) -> None:
        while True:
            await asyncio.sleep(BACKLOG_REPORT_S)
            res = self._ports
            if res is None:
                continue
            waiting = list(self._oldest.values())
            tiers = {self.tier} | {t for t, _, _ in waiting}
            try:
                for tier in tiers:
                    oldest = min((at for t, at, _ in waiting if t is tier), default=None)
                    await res.boards.report_backlog(tier, oldest)
            except STORE_DOWN:
                pass

    # ------------------------------------------------------------------ pipeline

    async def _infra(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry an infrastructure call with backoff; the message waits meanwhile (its source
        pauses once the channel's bound is reached). Gives up after ``INFRA_RETRY_FOR``."""
        delay = 0.2
        deadline = time.monotonic() + INFRA_RETRY_FOR.total_seconds()
        while True:
            try:
                return await fn()
            except Exception as exc:
                if time.monotonic() >= deadline:
                    raise InfraUnavailable(f"{what} unavailable for {INFRA_RETRY_FOR}") from exc
                log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _redis(self, fn: Callable[[], Awaitable[T]], fallback: T) -> T:
        """A dedup call. Redis down: tiers on ``local`` continue without cluster dedup
        (``fallback``); tiers on ``pause`` wait until Redis answers again."""
        while True:
            try:
                result = await fn()
            except STORE_DOWN as exc:
                if self.redis_ok:
                    log.warning("redis unavailable (%s): %s", exc,
                                "sending without cluster dedup" if self.policy.redis_down ==
                                "local" else "pausing sends")
                self.redis_ok = False
                if self.policy.redis_down == "local":
                    return fallback
                await asyncio.sleep(REDIS_PAUSE_S)
                continue
            if not self.redis_ok:
                log.warning("redis is back")
            self.redis_ok = True
            return result

    async def _batch(self, batch: list[Work],
                     futures: list[concurrent.futures.Future[list[Out]]],
                     submitted: float) -> None:
        started = time.time()
        try:
            if self._ports is None:
                await asyncio.wrap_future(self._opened)
            plan = await self._prepare(batch)
        except Exception as exc:
            log.exception("send preparation failed")
            for w, fut in zip(batch, futures, strict=True):
                self._resolve(w, fut, exc)
            return
        prepared = time.time()
        for w, fut in zip(batch, futures, strict=True):
            item = plan[id(w)]
            if isinstance(item, list):
                self._resolve(w, fut, item)
            else:
                budget_until_prepared(w, submitted, started, prepared)
                msg, content_key = item
                asyncio.get_running_loop().create_task(self._send(w, msg, content_key, fut))

    async def _prepare(self, batch: list[Work]) -> dict[int, Any]:
        """Per message: the final outputs (a list) or (message, provider, content key)."""
        res = self.ports
        dedup = res.leases
        now = self.clock()
        plan: dict[int, Any] = {}
        batch = self._crash_looped(batch, plan, now)
        if not batch:
            return plan
        checks = [w for w in batch if w.record.unknown_check is not None]
        if checks:
            await self._resolve_unknown(checks, plan, now)
            batch = [w for w in batch if id(w) not in plan]
            if not batch:
                return plan
        keys = [dedup.lease_key(w.message_id, w.record.attempt) for w in batch]
        ttl = max(self._lease_ttl(w) for w in batch)
        states = await self._redis(lambda: dedup.acquire(keys, ttl),
                                   [LeaseState(True) for _ in keys])
        live: list[Work] = []
        for w, key, st in zip(batch, keys, states, strict=True):
            if st.acquired:
                live.append(w)
            elif (done := st.done) is not None:
                plan[id(w)] = self._replayed(w, done, now)
            elif (owner := st.pending_owner()) is not None and owner != dedup.owner:
                since = datetime.fromtimestamp((st.pending_since_ms() or 0) / 1000, UTC)
                stale_at = since + self._stale_after(w)
                if now < stale_at:
                    plan[id(w)] = [retry_record(w, w.record.attempt, stale_at)]
                elif await self._redis(functools.partial(dedup.take_over, key,
                                                         st.holder or "", ttl), True):
                    log.warning("message %s attempt %s: resuming after a crashed sender "
                                "(possible duplicate)", w.message_id, w.record.attempt)
                    live.append(w)
                else:
                    plan[id(w)] = [retry_record(w, w.record.attempt,
                                                now + self._stale_after(w))]
            else:
                plan[id(w)] = []
        live = await self._drop_already_final(live, plan)

        for w in live:
            if is_expired(w, now):
                plan[id(w)] = await self._finished(
                    w, status_event(w, Status.EXPIRED, now, self.source, reason="ttl"))
        live = [w for w in live if id(w) not in plan]
        live = await self._capped(live, plan, now)

        fresh = [w for w in live if w.record.idempotency_key is None]
        claims = [(dedup.content_key(w.record.tenant_id, content_fingerprint(w)), w.message_id)
                  for w in fresh]
        unclaimed: list[str | None] = [None] * len(claims)
        holders = await self._redis(lambda: dedup.claim_content(claims, self.content_window),
                                    unclaimed)
        content_keys: dict[int, str] = {}
        for w, (ckey, _), holder in zip(fresh, claims, holders, strict=True):
            if holder:
                plan[id(w)] = await self._finished(w, status_event(
                    w, Status.SUPPRESSED, now, self.source,
                    reason=f"duplicate_content_of:{holder}"))
            else:
                content_keys[id(w)] = ckey
        live = [w for w in live if id(w) not in plan]

        live = await self._strong_consent(live, plan, now)
        rendered = await self._render(live)
        for w in live:
            r = rendered[w.message_id]
            if isinstance(r, RenderFailure):
                plan[id(w)] = [dead_letter(
                    raw=w.raw, source=w.source, reason=f"renderer failed: {r.reason}",
                    error_class="render_error", category="bug", tier=w.record.tier,
                    cipher=self.cipher, now=now, message_id=w.message_id,
                    tenant_id=w.record.tenant_id, headers=w.headers)]
                await self._release(w)
            elif isinstance(r, str):
                plan[id(w)] = await self._finished(
                    w, status_event(w, Status.FAILED, now, self.source, reason=r),
                    content_keys.get(id(w)))
            elif not self._candidates(w):
                plan[id(w)] = [dead_letter(
                    raw=w.raw, source=w.source, reason=f"no provider for {w.record.channel}",
                    error_class="channel_unavailable", category="unavailable", tier=w.record.tier,
                    cipher=self.cipher, now=now, message_id=w.message_id,
                    tenant_id=w.record.tenant_id, headers=w.headers)]
                await self._release(w)
            else:
                plan[id(w)] = (r, content_keys.get(id(w)))
        return plan

    async def _capped(self, live: list[Work], plan: dict[int, Any],
                      now: datetime) -> list[Work]:
        """Recipient and tenant caps (``flows/caps.py``), counted in Redis; over a cap →
        SUPPRESSED. Redis down on a tier that keeps sending: :class:`LocalCaps` with this
        process's share of each limit, except that marketing waits (fails closed)."""
        caps = self.ports.caps
        checked = [(w, c) for w in live if (c := cap_check(w, self.settings, now)) is not None]
        if not checked:
            return live
        checks = [c for _, c in checked]
        counted: list[Verdict] | None = await self._redis(lambda: caps.admit(checks, now), None)
        verdicts: list[Verdict | None] = (
            list(counted) if counted is not None
            else [None if c.fail_closed else self._local_caps.admit(c, now) for c in checks])
        waiting: list[str] = []
        for (w, _), verdict in zip(checked, verdicts, strict=True):
            if verdict is None:
                plan[id(w)] = [retry_record(w, w.record.attempt,
                                            now + timedelta(seconds=REDIS_CLOSED_WAIT_S))]
                waiting.append(self.ports.leases.lease_key(w.message_id, w.record.attempt))
            elif verdict is not Verdict.OK:
                plan[id(w)] = await self._finished(w, status_event(
                    w, Status.SUPPRESSED, now, self.source, reason=verdict.value))
        if waiting:
            dedup = self.ports.leases
            await self._redis(lambda: dedup.release(waiting), None)
        return [w for w in live if id(w) not in plan]

    async def _strong_consent(self, live: list[Work], plan: dict[int, Any],
                              now: datetime) -> list[Work]:
        """Re-read the preferences of strong-consent categories (marketing) from Cassandra,
        so an opt-out acknowledged by the API applies to every later send."""
        strong = [w for w in live if w.record.category in self.settings.strong_consent_categories]
        if not strong:
            return live
        keys = sorted({(w.record.tenant_id, w.recipient_hash) for w in strong})
        states: dict[str, Any] = {}
        step = self.policy.store_concurrency
        for i in range(0, len(keys), step):
            chunk = keys[i:i + step]
            states.update(await self._infra(
                "cassandra", functools.partial(self.ports.preferences.get_states, chunk)))
        for w in strong:
            state = states.get(state_key(w.record.tenant_id, w.recipient_hash))
            reason = state.blocks(w.record.channel, w.record.category) if state else None
            if reason:
                plan[id(w)] = await self._finished(
                    w, status_event(w, Status.SUPPRESSED, now, self.source, reason=reason))
        return [w for w in live if id(w) not in plan]

    def _candidates(self, w: Work) -> list[Any]:
        res = self.ports
        return rank_routes(self.settings.routes, tier=w.record.tier, channel=w.record.channel,
                           recipient=w.record.recipient, enabled=frozenset(res.providers),
                           weight=res.breakers.weight, avoid=w.record.avoid_provider)

    async def _send(self, w: Work, msg: OutboundMessage, content_key: str | None,
                    fut: concurrent.futures.Future[list[Out]]) -> None:
        """Route, take a capacity token, then call the provider and record the outcome on
        the lease inside the channel's in-flight bound, so at most ``max_in_flight`` sends
        per channel are unrecorded when the process dies. Retries (attempt > 1) also pass
        a gate of ``retry_share`` of that bound, so a retry storm cannot starve new traffic."""
        gate = (self._retry_sems[w.record.channel] if w.record.attempt > 1
                else contextlib.nullcontext())
        r = w.record
        attrs = {names.ATTR_MESSAGE_ID: w.message_id, names.ATTR_TENANT_ID: r.tenant_id,
                 names.ATTR_TIER: r.tier.value, names.ATTR_CHANNEL: r.channel.value,
                 names.ATTR_ATTEMPT: r.attempt}
        entered = time.monotonic()
        async with gate:
            with telemetry.span(names.SEND, attrs, parent=header_traceparent(w.headers)):
                await self._attempt(w, msg, content_key, fut, entered)

    async def _attempt(self, w: Work, msg: OutboundMessage, content_key: str | None,
                       fut: concurrent.futures.Future[list[Out]], entered: float) -> None:
        res = self.ports
        tier = w.record.tier.value
        try:
            tenant = self.settings.tenant(w.record.tenant_id)
            choice = await reserve(self._candidates(w), res.breakers, res.quota,
                                   w.record.tier, tenant_id=w.record.tenant_id,
                                   tenant_rate=tenant.rate_limit if tenant else None)
            routed = time.monotonic()
            stages.record(tier, Stage.DISPATCH_ROUTE, routed - entered)
            if not isinstance(choice, Choice):
                self._resolve(w, fut, await self._all_unavailable(w, choice))
                return
            provider = res.providers[choice.provider_id]
            async with self._sems[w.record.channel]:
                key = res.leases.lease_key(w.message_id, w.record.attempt)
                if not await self._redis(lambda: res.leases.confirm(key, self._lease_ttl(w)),
                                         True):
                    log.warning("message %s attempt %s: lease taken over by another sender; "
                                "not sending", w.message_id, w.record.attempt)
                    self._resolve(w, fut, [])
                    return
                started = time.monotonic()
                stages.record(tier, Stage.DISPATCH_SLOT, started - routed)
                with telemetry.span(names.PROVIDER_CALL, {
                        names.ATTR_MESSAGE_ID: w.message_id,
                        names.ATTR_PROVIDER: provider.provider_id,
                        names.ATTR_CHANNEL: w.record.channel.value,
                        names.ATTR_ATTEMPT: w.record.attempt}) as call:
                    try:
                        result = await provider.send(msg)
                    except Exception as exc:
                        log.error("provider call raised for %s: %r", w.message_id, exc)
                        at = self.clock()
                        result = SendResult(Outcome.TRANSIENT, provider.provider_id, at, at,
                                            reason=f"internal_error:{type(exc).__name__}")
                    elapsed = time.monotonic() - started
                    _metrics.provider_call(call, w, result, elapsed)
                    stages.record(tier, Stage.PROVIDER, elapsed)
                if not (result.reason or "").startswith("internal_error"):
                    await res.breakers.record(
                        provider.provider_id, result.outcome, result.reason,
                        time.monotonic() - started, choice.probe,
                        episode=getattr(choice.admission, "episode", None))
                outs = await self._outcome(w, result, content_key, msg)
                trace.get_current_span().set_attributes({
                    names.ATTR_PROVIDER: provider.provider_id,
                    names.ATTR_OUTCOME: attempt_outcome(result)})
            self._resolve(w, fut, outs)
        except Exception as exc:
            log.exception("send of %s failed", w.message_id)
            if not isinstance(exc, (InfraUnavailable, *STORE_DOWN)):
                await self._count_crash(w)
            self._resolve(w, fut, exc)

    async def _count_crash(self, w: Work) -> None:
        """The flow is about to stop because of this record: count it, so the next start
        dead-letters it instead of crash-looping, and free its lease (this process will not
        finish the attempt; the restart may, as a takeover of a stale lease would)."""
        try:
            n = await self.ports.leases.count_crash(self.source, crash_field(w), CRASH_MEMORY)
            log.error("message %s attempt %d (source %s:%d:%d) crashed the flow %d time(s)",
                      w.message_id, w.record.attempt, w.source.topic, w.source.partition,
                      w.source.offset, n)
            await self._release(w)
        except STORE_DOWN as exc:
            log.warning("crash of %s not counted: %r", crash_field(w), exc)

    def _crash_looped(self, batch: list[Work], plan: dict[int, Any],
                      now: datetime) -> list[Work]:
        """Records that crashed the flow ``dlq.max_crashes`` times → DLQ (category bug)."""
        limit = self.settings.dlq.max_crashes
        for w in batch:
            n = self._crashes.get(crash_field(w), 0)
            if n >= limit:
                plan[id(w)] = [dead_letter(
                    raw=w.raw, source=w.source, reason=f"crashed the flow {n} times",
                    error_class="crash_loop", category="bug", tier=w.record.tier,
                    cipher=self.cipher, now=now, message_id=w.message_id,
                    tenant_id=w.record.tenant_id, headers=w.headers)]
        return [w for w in batch if id(w) not in plan]

    async def _all_unavailable(self, w: Work, choice: Unavailable | None) -> list[Out]:
        """Every provider of the channel is refused by its breaker: no attempt is spent; the
        message waits (same attempt) until a breaker may admit it, or expires."""
        now = self.clock()
        wait = timedelta(seconds=choice.retry_in if choice else 1.0)
        due = now + max(wait, timedelta(milliseconds=100))
        await self._release(w)
        assert w.record.expires_at is not None
        if due >= w.record.expires_at:
            return await self._finished(w, status_event(
                w, Status.EXPIRED, now, self.source, reason="all_providers_unavailable"))
        return [status_event(w, Status.RETRY_PENDING, now, self.source,
                             reason="all_providers_unavailable", next_attempt_at=due),
                retry_record(w, w.record.attempt, due)]

    async def _outcome(self, w: Work, result: SendResult, content_key: str | None,
                       msg: OutboundMessage | None = None) -> list[Out]:
        detail = attempt_detail(w, result)
        at = result.completed_at
        tier_policy = self.settings.policy(w.record.tier)
        if result.deactivate_recipient:
            await self._suppress(w, result.reason or "deactivated")
        if result.outcome is Outcome.ACCEPTED:
            latency = max(0.0, (at - w.accepted_at).total_seconds())
            _metrics.accept_to_provider.record(
                latency, {"tier": w.record.tier.value, "channel": w.record.channel.value,
                          "provider": result.provider_id})
            if w.record.tier is Tier.P0:
                self._p0_latencies.add(latency)
            return await self._finished(w, status_event(
                w, Status.PROVIDER_ACCEPTED, at, self.source, detail=detail))
        if result.outcome is Outcome.PERMANENT:
            return await self._finished(w, status_event(
                w, Status.FAILED, at, self.source, reason=result.reason, detail=detail),
                content_key)
        if result.outcome is Outcome.AMBIGUOUS and tier_policy.on_ambiguous == "wait":
            check_at = at + self.settings.scaled(self.settings.unknown_resolution)
            check = w.record.model_copy(update={"unknown_check": w.record.attempt,
                                                "not_before": check_at})
            return await self._finished(w, status_event(
                w, Status.UNKNOWN, at, self.source, reason=result.reason, detail=detail,
                next_attempt_at=check_at), follow=[Retry(w, check)])
        retry_after = timedelta(seconds=result.retry_after_s) if result.retry_after_s else None
        assert w.record.expires_at is not None
        decision = RetryPolicy.for_tier(self.settings, w.record.tier).after_failure(
            w.record.attempt, at, w.record.expires_at, retry_after, self.rng,
            budget_base=w.record.budget_base or 1)
        if decision.next_attempt is not None and decision.next_attempt_at is not None:
            _metrics.retries.add(1, {"tier": w.record.tier.value,
                                     "channel": w.record.channel.value})
            nxt = retry_record(w, decision.next_attempt, decision.next_attempt_at)
            nxt = Retry(w, nxt.record.model_copy(update={"avoid_provider": result.provider_id}))
            status = Status.UNKNOWN if result.outcome is Outcome.AMBIGUOUS else \
                Status.RETRY_PENDING
            return await self._finished(w, status_event(
                w, status, at, self.source, reason=result.reason, detail=detail,
                next_attempt_at=decision.next_attempt_at), follow=[nxt])
        status = Status.EXPIRED if decision.give_up == "expires_before_retry" else Status.FAILED
        category = unexplained_category(result.reason)
        dead = [await self._unexplained(w, detail, at, msg, category)] if category else []
        return await self._finished(w, status_event(w, status, at, self.source,
                                                    reason=decision.give_up, detail=detail),
                                    content_key, follow=dead)

    async def _resolve_unknown(self, checks: list[Work], plan: dict[int, Any],
                               now: datetime) -> None:
        """Check records: an ambiguous attempt that no receipt resolved in time ends FAILED
        (``ambiguous``); one that a receipt moved on needs nothing."""
        store = self.ports.messages
        rows = await self._infra("cassandra", lambda: asyncio.gather(
            *(store.get_message(w.message_id) for w in checks)))
        for w, row in zip(checks, rows, strict=True):
            attempt = w.record.unknown_check or w.record.attempt
            current = int(row.get("status_rank") or 0) if row else 0
            if current <= rank(Status.UNKNOWN, attempt):
                plan[id(w)] = [status_event(w, Status.FAILED, now, self.source,
                                            reason="ambiguous", attempt=attempt)]
            else:
                plan[id(w)] = []

    async def _finished(self, w: Work, ev: StatusEvent, content_key: str | None = None,
                        follow: Sequence[Out] | None = None) -> list[Out]:
        """Record the attempt's end and what follows it on its lease (so a replay never
        sends it again and re-emits the same outputs) and free the content fingerprint of a
        message that will never be delivered. Returns ``[ev, *follow]``."""
        dedup = self.ports.leases
        key = dedup.lease_key(w.message_id, w.record.attempt)
        done = lease_outcome(ev, follow or ())
        await self._redis(lambda: dedup.finish([(key, done)], self._lease_ttl(w)), None)
        if content_key and ev.status in (Status.FAILED, Status.EXPIRED):
            await self._redis(lambda: dedup.release_content([(content_key, w.message_id)]),
                              None)
        return [ev, *(follow or ())]

    async def _release(self, w: Work) -> None:
        dedup = self.ports.leases
        key = dedup.lease_key(w.message_id, w.record.attempt)
        await self._redis(lambda: dedup.release([key]), None)

    async def _suppress(self, w: Work, reason: str) -> None:
        """The provider says the address or token is dead: suppress it for later messages."""
        why: Suppression = ("unsubscribed" if reason == "unsubscribed" else
                            "token_deactivated" if w.record.channel is Channel.PUSH
                            else "hard_bounce")
        try:
            await self.ports.preferences.suppress(w.record.tenant_id, w.recipient_hash, why)
        except Exception as exc:
            log.warning("could not record suppression for %s: %r", w.message_id, exc)

    def _stale_after(self, w: Work) -> timedelta:
        """How long another process's pending lease is respected: the tier's provider
        timeout twice over plus a margin (an owner confirms its lease just before calling)."""
        return self.settings.policy(w.record.tier).provider_timeout * 2 + STALE_MARGIN

    def _lease_ttl(self, w: Work) -> timedelta:
        return scaled_lease_ttl(self.settings, w.record.tier)

    def _replayed(self, w: Work, done: dict[str, Any], now: datetime) -> list[Out]:
        """A record seen again after its attempt ended: re-emit the recorded outcome and what
        followed it (they may not have reached Kafka before a crash; a duplicate retry record
        is harmless, its own lease decides); never call the provider again."""
        detail = AttemptRecord.model_validate(done["detail"]) if done.get("detail") else None
        nxt = done.get("next_attempt_at")
        outs: list[Out] = [status_event(
            w, Status(str(done["status"])), now, self.source, reason=done.get("reason"),
            detail=detail, next_attempt_at=datetime.fromisoformat(nxt) if nxt else None)]
        if done.get("retry"):
            outs.append(Retry(w, IngestRecord.model_validate(done["retry"])))
        if done.get("dlq"):
            outs.append(DlqRecord.model_validate(done["dlq"]))
        return outs

    async def _drop_already_final(self, live: list[Work], plan: dict[int, Any]) -> list[Work]:
        """A lease can only have expired for an old record: ask Cassandra whether the message
        already ended before sending it again."""
        store = self.ports.messages
        now = self.clock()
        old = [w for w in live if now - w.accepted_at > self._lease_ttl(w)]
        if not old:
            return live
        rows = await self._infra("cassandra", lambda: asyncio.gather(
            *(store.get_message(w.message_id) for w in old)))
        for w, row in zip(old, rows, strict=True):
            if row and row.get("status_rank", 0) >= rank(Status.SUPPRESSED):
                plan[id(w)] = []
        return [w for w in live if id(w) not in plan]

    async def _render(self, batch: list[Work]) -> dict[str, OutboundMessage | str | RenderFailure]:
        """message_id → rendered message, the FAILED reason, or a renderer failure."""
        from notiflow.templating import MissingVariable, RenderError, render
        store = self.ports.messages
        wanted = sorted({(w.record.tenant_id, w.record.template_id, w.record.template_version)
                         for w in batch} - self._templates.keys())
        if wanted:
            rows = await self._infra("cassandra", lambda: asyncio.gather(
                *(store.get_template(*k) for k in wanted)))
            for k, row in zip(wanted, rows, strict=True):
                if row is not None:
                    self._templates[k] = row
        result: dict[str, OutboundMessage | str | RenderFailure] = {}
        for w in batch:
            r = w.record
            tpl = self._templates.get((r.tenant_id, r.template_id, r.template_version))
            if tpl is None:
                result[w.message_id] = "unknown_template"
                continue
            if tpl["channel"] != r.channel.value:
                result[w.message_id] = "template_channel_mismatch"
                continue
            try:
                subject, body = render(tpl, r.variables)
            except MissingVariable as exc:
                result[w.message_id] = f"missing_template_variable:{exc.name}"
                continue
            except RenderError as exc:
                result[w.message_id] = RenderFailure(str(exc))
                continue
            result[w.message_id] = OutboundMessage(
                message_id=w.message_id, attempt=r.attempt, tenant_id=r.tenant_id,
                channel=r.channel, tier=r.tier, recipient=r.recipient, body=body,
                subject=subject)
        return result

    async def _unexplained(self, w: Work, detail: AttemptRecord, now: datetime,
                           msg: OutboundMessage | None, category: str) -> DlqRecord:
        """The DLQ record of a message whose budget ran out on unexplained failures: every
        attempt known to Cassandra plus the last one, and the rendered message (encrypted)."""
        attempts = {detail.attempt_no: detail}
        try:
            for row in await self.ports.messages.attempts(w.message_id):
                a = attempt_from_row(row)
                if a is not None:
                    attempts.setdefault(a.attempt_no, a)
        except Exception as exc:
            log.warning("attempts of %s not read for its dead letter: %r", w.message_id, exc)
        rec = dead_letter(raw=w.raw, source=w.source, reason="retries exhausted after "
                          f"unexplained failures ({detail.normalized_error})",
                          error_class="exhausted_unexplained", category=category,
                          tier=w.record.tier, cipher=self.cipher, now=now,
                          message_id=w.message_id, tenant_id=w.record.tenant_id,
                          headers=w.headers,
                          attempts=tuple(attempts[k] for k in sorted(attempts)))
        if msg is None:
            return rec
        rendered = orjson.dumps({"subject": msg.subject, "body": msg.body})
        return rec.model_copy(update={"rendered_encrypted": self.cipher.encrypt(rendered)})


NO_ANSWER = frozenset({"connect_error", "connect_timeout", "timeout", "connection_lost"})
"""Transient reasons where no provider answered: an outage of the provider or of the path."""


def unexplained_category(reason: str | None) -> str | None:
    """The DLQ category of a budget that ran out on ``reason``, or None when the last failure
    was a provider's answer (FAILED only, no dead letter): our own exception → ``bug``
    (escalate); no answer at all → ``provider_outage`` (a bulk-replay candidate)."""
    if (reason or "").startswith("internal_error"):
        return "bug"
    return "provider_outage" if reason in NO_ANSWER else None


def attempt_from_row(row: dict[str, Any]) -> AttemptRecord | None:
    """A row of Cassandra ``attempts`` as an :class:`AttemptRecord` (None if incomplete)."""
    def aware(d: datetime | None) -> datetime | None:
        return d.replace(tzinfo=UTC) if d is not None and d.tzinfo is None else d

    try:
        return AttemptRecord(
            attempt_no=row["attempt_no"], provider_id=row["provider_id"],
            outcome=row["outcome"], provider_message_id=row.get("provider_message_id"),
            normalized_error=row.get("normalized_error"), error_code=row.get("error_code"),
            started_at=aware(row.get("started_at")), completed_at=aware(row.get("completed_at")))
    except (KeyError, ValueError):
        return None


def budget_until_prepared(w: Work, submitted: float, started: float, prepared: float) -> None:
    """Record the latency budget's stages up to ``dispatch.prepare`` (epoch seconds);
    ``kafka`` and ``flow`` only for a record that was due when parsed (a held one's wait
    is its schedule, not a delay)."""
    tier = w.record.tier.value
    if w.seen_at and w.due_at is None:
        if w.source.timestamp_ms:
            stages.record(tier, Stage.KAFKA, w.seen_at - w.source.timestamp_ms / 1000)
        stages.record(tier, Stage.FLOW, submitted - w.seen_at)
    stages.record(tier, Stage.DISPATCH_QUEUE, started - submitted)
    stages.record(tier, Stage.DISPATCH_PREPARE, prepared - started)


def shard_key(work: Work, shards: int) -> str:
    """``{channel}:{shard}``: spreads a channel's messages over the workers."""
    digest = hashlib.blake2b(work.message_id.encode(), digest_size=4).digest()
    return f"{work.record.channel.value}:{int.from_bytes(digest, 'big') % shards}"


class SendLogic(StatefulBatchLogic[Work, Out, list[Work]]):
    """Keyed by ``{channel}:{shard}``. State: the messages handed to the dispatcher whose
    outcome has not been emitted yet (resubmitted on resume).

    At most one submission per (message, attempt) is pending here, and its future is the one
    whose outcome is emitted: a copy of a pending attempt is dropped, whether it arrives in a
    later batch or in the same one (a replay after a crash re-reads a retry record and
    re-emits it from the dedup lease; both copies are held until the same ``not_before``).
    The dispatcher answers a copy whose lease this process holds with no outputs, so a copy's
    future must never take the place of the attempt's own."""

    def __init__(self, dispatcher: Dispatcher, resume: list[Work] | None,
                 eof_timeout: float = 120.0) -> None:
        self.d = dispatcher
        self.pending: dict[str, tuple[Work, concurrent.futures.Future[list[Out]]]] = {}
        self._done: collections.deque[str] = collections.deque()
        """Keys whose future finished (appended by the future's callback, any thread), so a
        collect costs what finished, not what is pending."""
        self.eof_timeout = eof_timeout
        if resume:
            self._submit(resume)

    def _submit(self, works: Iterable[Work]) -> None:
        """Hand the attempts not pending yet to the dispatcher (first copy of each wins)."""
        new: dict[str, Work] = {}
        for w in works:
            k = f"{w.message_id}:{w.record.attempt}"
            if k not in self.pending:
                new.setdefault(k, w)
        if new:
            futs = self.d.submit(list(new.values()))
            for (k, w), f in zip(new.items(), futs, strict=True):
                self.pending[k] = (w, f)
                f.add_done_callback(functools.partial(self._finished_future, k))

    def _finished_future(self, key: str, _future: object) -> None:
        self._done.append(key)

    def _collect(self) -> list[Out]:
        out: list[Out] = []
        while self._done:
            entry = self.pending.pop(self._done.popleft(), None)
            if entry is not None:
                out.extend(entry[1].result())
        return out

    def _keep(self) -> bool:
        return StatefulBatchLogic.RETAIN if self.pending else StatefulBatchLogic.DISCARD

    def on_batch(self, values: list[Work]) -> tuple[Iterable[Out], bool]:
        self._submit(values)
        return self._collect(), self._keep()

    def on_notify(self) -> tuple[Iterable[Out], bool]:
        return self._collect(), self._keep()

    def on_eof(self) -> tuple[Iterable[Out], bool]:
        """Finite input (tests): wait for the messages still in flight."""
        concurrent.futures.wait([f for _, f in self.pending.values()],
                                timeout=self.eof_timeout)
        return self._collect(), self._keep()

    def notify_at(self) -> datetime | None:
        return datetime.now(UTC) + POLL if self.pending else None

    def snapshot(self) -> list[Work]:
        return [w for w, _ in self.pending.values()]
