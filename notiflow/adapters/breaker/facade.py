"""Per-process circuit breakers over the shared state: :class:`CircuitBreakers`.

Redis down (connection error or timeout): each process continues on local breakers (the
reference model, same rules, seeded with the last shared state it saw) and logs once; a
background probe retries Redis at most every ``retry_interval``; once it answers, each provider
adopts the shared state on its next op and drops its local one (a ``converged`` change event
when the two differed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from notiflow.adapters.breaker.model import (
    NORMAL,
    PEEK,
    Admission,
    AdmissionKind,
    BreakerSource,
    ModelState,
    Op,
    Snapshot,
    State,
    StateChange,
    StepResult,
    Verdict,
    classify,
    effective_state,
    run_model,
    snapshot,
    wall_us,
    weight_at,
)
from notiflow.adapters.breaker.store import BreakerStore
from notiflow.adapters.outages import REDIS_UNREACHABLE
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.adapters.redis_health import RedisGuard, RedisHealth
from notiflow.settings import Settings

log = logging.getLogger("notiflow.adapters.breaker")

_SUCCESS = Op("r", Verdict.SUCCESS)
_SLOW_SUCCESS = Op("r", Verdict.SUCCESS, slow=True)


@dataclass(slots=True)
class BreakerStats:
    """Counters of one :class:`CircuitBreakers` (for metrics and benchmarks)."""

    round_trips: int = 0
    ops: int = 0
    deferred: int = 0
    local_ops: int = 0
    refreshes: int = 0
    dropped_events: int = 0


_Pending = tuple[Op, "asyncio.Future[bool] | None"]


@dataclass(slots=True)
class _Entry:
    snap: Snapshot | None = None
    got_us: int = 0
    pending: list[_Pending] = field(default_factory=list)
    urgent: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    latest: asyncio.Future[bool] | None = None
    flusher: asyncio.Task[None] | None = None
    seen: int = 0
    seen_episode: int = -1
    local: ModelState | None = None


class CircuitBreakers:
    """The breakers of every provider account, for one process (one event loop).

    :meth:`allow` answers from a local copy of the shared state while it is younger than
    ``cache_ttl`` (no Redis call); it asks Redis when the copy is stale and for probe
    candidates. :meth:`record` applies failures, throttling and probe outcomes in Redis
    before it returns; plain successes (not probes) are deferred: they ride, in order, with
    the next script call for that provider, at most ``flush_interval`` later (every prompt
    outcome flushes the successes recorded before it; a success decides an opening only by
    completing ``min_calls`` or as a slow call, which then happens at most that much later).
    Ops for one provider share one script call (at most ``max_batch``, in arrival order), so
    there is at most one script call in flight per provider and process. When a script call
    fails with a connection error or timeout, its ops and all later ones run on local
    breakers; a background probe retries Redis at most every ``retry_interval`` (callers
    never wait for it), and on success each provider adopts the shared state on its next op.
    ``clock_us`` (tests) drives the local clock and the script's ``now_us``.
    """

    def __init__(self, source: Settings | BreakerSource, *, cache_ttl: float = 0.2,
                 flush_interval: float = 0.1, retry_interval: float = 0.5,
                 max_batch: int = 512, event_queue: int = 1000,
                 clock_us: Callable[[], int] | None = None, lane: str = "",
                 store_timeout: float = 0.5, health: RedisHealth | None = None,
                 max_entries: int = 10_000) -> None:
        """``source``: the settings (opens its own :class:`BreakerStore` of ``lane`` whose
        Redis calls time out after ``store_timeout`` seconds), or a store. ``health``: the
        process's shared view of Redis (default: one of its own); while it says down,
        decide locally without asking. ``max_entries``: breakers kept in this process (ids
        of tenants' endpoints come from tenant input); beyond it the oldest idle copies are
        forgotten (the shared state stays in Redis and is read again when asked)."""
        if (cache_ttl < 0 or flush_interval < 0 or retry_interval <= 0 or max_batch < 1
                or event_queue < 1 or max_entries < 1):
            raise ValueError("bad breaker parameters")
        self._flush_interval = flush_interval
        self.lane = lane
        self.store: BreakerSource = (BreakerStore.open(source, store_timeout, lane=lane)
                                     if isinstance(source, Settings) else source)
        self.params = self.store.params
        self.stats = BreakerStats()
        self._driven = clock_us is not None
        self._clock = clock_us or wall_us
        self._cache_us = round(cache_ttl * 1_000_000)
        self._retry_us = round(retry_interval * 1_000_000)
        self._max_batch = max_batch
        self._event_queue = event_queue
        self._entries: dict[str, _Entry] = {}
        self._max_entries = max_entries
        self._listeners: list[Callable[[StateChange], None]] = []
        self._queues: list[asyncio.Queue[StateChange]] = []
        self._probe: asyncio.Future[None] | None = None
        self.health = health or RedisHealth()
        self.guard = RedisGuard(self.health, self._retry_us, self._clock)

    @property
    def redis_ok(self) -> bool:
        """False while Redis is unreachable (local breakers decide)."""
        return self.guard.ok

    # decisions

    async def _fresh(self, provider_id: str) -> tuple[_Entry, int]:
        """The provider's entry with a snapshot no older than the cache allows, and now."""
        e = self._entry(provider_id)
        now = self._clock()
        if e.snap is None or not 0 <= now - e.got_us < self._cache_us:
            await self._refresh(provider_id, e)
            now = self._clock()
        return e, now

    async def allow(self, provider_id: str) -> Admission:
        """Admit as normal (CLOSED), as a probe (HALF_OPEN), or refuse with ``retry_in``."""
        e, now = await self._fresh(provider_id)
        assert e.snap is not None
        if e.snap.state is State.CLOSED:
            return NORMAL
        t = self._redis_time(e, now)
        if effective_state(e.snap, t) is State.OPEN:
            return Admission(AdmissionKind.REFUSED, (e.snap.until_us - t) / 1_000_000,
                             e.snap.episode)
        if e.seen_episode != e.snap.episode:
            e.seen_episode, e.seen = e.snap.episode, 0
        e.seen += 1
        last = e.snap.probe_last_us if e.snap.state is State.HALF_OPEN else -1
        floor = last < 0 or t - last >= self.params.probe_gap_us
        if floor or e.seen % self.params.probe_every == 0:
            if await self._submit(provider_id, e, Op("g" if floor else "n")):
                return Admission(AdmissionKind.PROBE, 0.0, e.snap.episode)
            now = self._clock()
            t = self._redis_time(e, now)
            state = effective_state(e.snap, t)
            if state is State.CLOSED:
                return NORMAL
            if state is State.OPEN:
                return Admission(AdmissionKind.REFUSED, (e.snap.until_us - t) / 1_000_000,
                                 e.snap.episode)
        return Admission(AdmissionKind.REFUSED, self._probe_wait(e.snap, t) / 1_000_000,
                         e.snap.episode)

    async def peek(self, provider_id: str) -> Admission:
        """What :meth:`allow` would say for a breaker this process only watches: REFUSED
        with ``retry_in`` while OPEN, NORMAL otherwise (HALF_OPEN included: probing is the
        business of the processes that record outcomes). Never admits a probe."""
        e, now = await self._fresh(provider_id)
        assert e.snap is not None
        t = self._redis_time(e, now)
        if effective_state(e.snap, t) is State.OPEN:
            return Admission(AdmissionKind.REFUSED, (e.snap.until_us - t) / 1_000_000,
                             e.snap.episode)
        return NORMAL

    async def record(self, provider_id: str, outcome: Outcome, reason: str | None,
                     latency_s: float, probe: bool = False, *,
                     episode: int | None = None) -> State:
        """Apply one outcome (shared state, or the local breaker while Redis is down) and
        return the state after it. ``probe``/``episode`` come from the :class:`Admission`;
        a probe outcome of another episode is ignored (``episode=None``: the current one)."""
        verdict = classify(outcome, reason, self.params.throttle_reasons)
        slow = self.params.is_slow(latency_s)
        e = self._entry(provider_id)
        if verdict is Verdict.SUCCESS and not probe:
            self._defer(provider_id, e, _SLOW_SUCCESS if slow else _SUCCESS)
        else:
            await self._submit(provider_id, e, Op("r", verdict, slow, probe,
                                                  -1 if episode is None else episode,
                                                  reason or ""))
        return self.state(provider_id)

    async def record_result(self, result: SendResult, admission: Admission) -> State:
        """:meth:`record` for an adapter's :class:`SendResult` (latency = completed -
        started)."""
        latency = (result.completed_at - result.started_at).total_seconds()
        return await self.record(result.provider_id, result.outcome, result.reason, latency,
                                 admission.probe, episode=admission.episode)

    def state(self, provider_id: str) -> State:
        """The state as this process knows it (CLOSED for a provider never seen); an OPEN
        breaker whose time is up reads HALF_OPEN."""
        e = self._entries.get(provider_id)
        if e is None or e.snap is None:
            return State.CLOSED
        return effective_state(e.snap, self._redis_time(e, self._clock()))

    def weight(self, provider_id: str) -> float:
        """Route weight in ``[min_weight, 1]``: lowered by throttling, recovering over time
        (1.0 for a provider never seen)."""
        e = self._entries.get(provider_id)
        if e is None or e.snap is None:
            return 1.0
        t = self._redis_time(e, self._clock())
        return weight_at(e.snap.weight, e.snap.now_us, t, self.params.recovery_us)

    def snapshot(self, provider_id: str) -> Snapshot | None:
        """The last state this process received (None before the first call)."""
        e = self._entries.get(provider_id)
        return None if e is None else e.snap

    # events

    def on_change(self, listener: Callable[[StateChange], None]) -> Callable[[], None]:
        """Call ``listener`` for every transition made by this process's script calls (each
        shared transition is made by exactly one process), by its local breakers, and for
        each ``converged`` adoption; returns an unsubscribe function. Listener errors are
        logged, never raised."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    async def changes(self) -> AsyncIterator[StateChange]:
        """The changes of :meth:`on_change` from now on, endlessly (a bounded queue: the
        oldest are dropped when a slow consumer falls ``event_queue`` behind)."""
        queue: asyncio.Queue[StateChange] = asyncio.Queue(self._event_queue)
        self._queues.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._queues.remove(queue)

    async def flush(self, provider_id: str | None = None) -> None:
        """Apply deferred successes now (of one provider, or of all)."""
        ids = [provider_id] if provider_id is not None else list(self._entries)
        for pid in ids:
            e = self._entries.get(pid)
            if e is not None and e.pending:
                await self._submit(pid, e, PEEK)

    async def aclose(self) -> None:
        """Flush deferred outcomes, then close the store."""
        await self.flush()
        if self._probe is not None:
            self._probe.cancel()
        flushers = [e.flusher for e in self._entries.values() if e.flusher is not None]
        if flushers:
            await asyncio.gather(*flushers, return_exceptions=True)
        await self.store.aclose()

    # internals

    def _entry(self, provider_id: str) -> _Entry:
        e = self._entries.get(provider_id)
        if e is None:
            if len(self._entries) >= self._max_entries:
                self._prune()
            e = self._entries[provider_id] = _Entry()
        return e

    def _prune(self) -> None:
        """Forget the oldest idle entries (nothing queued or in flight, no local breaker)
        until a quarter of ``max_entries`` is free."""
        target = self._max_entries - max(1, self._max_entries // 4)
        for pid in list(self._entries):
            if len(self._entries) <= target:
                return
            e = self._entries[pid]
            if (not e.pending and e.flusher is None and e.local is None
                    and (e.latest is None or e.latest.done())):
                del self._entries[pid]

    def _redis_time(self, e: _Entry, now: int) -> int:
        assert e.snap is not None
        return e.snap.now_us + max(0, now - e.got_us)

    def _probe_wait(self, snap: Snapshot, t: int) -> int:
        gap = self.params.probe_gap_us
        if snap.state is not State.HALF_OPEN or snap.probe_last_us < 0:
            return gap
        return max(1, snap.probe_last_us + gap - t)

    async def _refresh(self, provider_id: str, e: _Entry) -> None:
        self.stats.refreshes += 1
        if e.latest is not None and not e.latest.done():
            await asyncio.shield(e.latest)
        else:
            await self._submit(provider_id, e, PEEK)

    def _defer(self, provider_id: str, e: _Entry, op: Op) -> None:
        self.stats.deferred += 1
        e.pending.append((op, None))
        if len(e.pending) >= self._max_batch:
            e.wake.set()
        if e.flusher is None:
            e.flusher = asyncio.ensure_future(self._flush(provider_id, e))

    async def _submit(self, provider_id: str, e: _Entry, op: Op) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        e.urgent += 1
        e.latest = fut
        e.wake.set()
        e.pending.append((op, fut))
        if e.flusher is None:
            e.flusher = asyncio.ensure_future(self._flush(provider_id, e))
        return await asyncio.shield(fut)

    async def _flush(self, provider_id: str, e: _Entry) -> None:
        batch: list[_Pending] = []
        try:
            while e.pending:
                if e.urgent == 0 and len(e.pending) < self._max_batch:
                    e.wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(e.wake.wait(), self._flush_interval)
                batch = e.pending[:self._max_batch]
                del e.pending[:self._max_batch]
                e.urgent -= sum(fut is not None for _, fut in batch)
                try:
                    result = await self._run(provider_id, e, [op for op, _ in batch])
                except Exception as exc:
                    if all(fut is None for _, fut in batch):
                        log.exception("breaker %s: deferred outcomes lost", provider_id)
                    for _, fut in batch:
                        if fut is not None and not fut.done():
                            fut.set_exception(exc)
                    batch = []
                    continue
                for (_, fut), granted in zip(batch, result.granted, strict=True):
                    if fut is not None and not fut.done():
                        fut.set_result(granted)
                batch = []
        finally:
            e.flusher = None
            leftovers = [*batch, *e.pending]
            e.pending.clear()
            e.urgent = 0
            for _, fut in leftovers:
                if fut is not None:
                    fut.cancel()

    async def _run(self, provider_id: str, e: _Entry, ops: list[Op]) -> StepResult:
        now = self._clock()
        if self.guard.asks:
            try:
                result = await self.store.run(provider_id, ops, now if self._driven else None)
            except REDIS_UNREACHABLE as exc:
                self._mark_down(exc, self._clock())
            else:
                self.guard.answered()
                self.stats.round_trips += 1
                self.stats.ops += len(ops)
                self._adopt(provider_id, e, result, shared=True)
                return result
        elif self.guard.may_probe():
            self._probe = asyncio.ensure_future(self._probe_redis(provider_id, e))
        if e.local is None:
            e.local = self._seed(e.snap)
        result = run_model(e.local, self.params, ops, self._clock())
        self.stats.local_ops += len(ops)
        self._adopt(provider_id, e, result, shared=False)
        return result

    async def _probe_redis(self, provider_id: str, e: _Entry) -> None:
        """Try Redis once in the background (callers keep deciding locally meanwhile)."""
        try:
            result = await self.store.run(provider_id, [PEEK],
                                          self._clock() if self._driven else None)
        except Exception as exc:
            if not isinstance(exc, REDIS_UNREACHABLE):
                log.exception("circuit breakers: Redis probe failed")
            self.guard.failed(exc)
        else:
            log.warning("circuit breakers: Redis reachable again; shared state resumes")
            self.guard.answered()
            self.stats.round_trips += 1
            self._adopt(provider_id, e, result, shared=True)
        finally:
            self._probe = None
            self.guard.probe_done()

    @staticmethod
    def _seed(snap: Snapshot | None) -> ModelState:
        if snap is None:
            return ModelState()
        return ModelState(state=snap.state, since_us=snap.since_us, until_us=snap.until_us,
                          episode=snap.episode, why=snap.why, probes=snap.probes,
                          probe_ok=snap.probe_ok, probe_slow=snap.probe_slow,
                          probe_last_us=snap.probe_last_us, weight=snap.weight,
                          weight_us=snap.now_us)

    def _adopt(self, provider_id: str, e: _Entry, result: StepResult, shared: bool) -> None:
        now = self._clock()
        if shared and e.local is not None:
            local = effective_state(snapshot(e.local, self.params),
                                    max(now, e.local.last_us or 0))
            e.local = None
            before = result.transitions[0].old if result.transitions else result.snapshot.state
            if local is not before:
                self._emit(StateChange(provider_id, local, before,
                                       _at(result.snapshot.now_us), "converged",
                                       result.snapshot.now_us, shared=False, lane=self.lane))
        e.snap = result.snapshot
        e.got_us = now
        for tr in result.transitions:
            self._emit(StateChange(provider_id, tr.old, tr.new, _at(tr.at_us), tr.why,
                                   tr.at_us, shared, self.lane))

    def _emit(self, change: StateChange) -> None:
        log.info("breaker %s%s: %s -> %s (%s)%s", change.provider_id,
                 f"@{change.lane}" if change.lane else "", change.old.value,
                 change.new.value, change.why, "" if change.shared else " [local]")
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("breaker state listener failed")
        for queue in self._queues:
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                self.stats.dropped_events += 1
            queue.put_nowait(change)

    def _mark_down(self, exc: BaseException, now: int) -> None:
        if self.guard.failed(exc, now):
            log.warning("circuit breakers: Redis unreachable (%s); local breakers decide "
                        "until it returns", exc)


def _at(at_us: int) -> datetime:
    return datetime.fromtimestamp(at_us / 1_000_000, UTC)

