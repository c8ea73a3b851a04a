"""Asynchronous sending: a per-process dispatcher and the keyed Bytewax logic that feeds it.

The dataflow never waits for a provider. :class:`SendLogic` (a ``StatefulBatchLogic`` keyed by
``{channel}:{shard}``) hands each message to the process's :class:`Dispatcher` and returns the
outcomes that have completed; a short timer collects the rest. Messages in flight are part of
the logic's snapshot, so an epoch can commit while they are in flight and a crash resubmits
them (the dedup lease decides whether they are sent again).

The dispatcher runs the send step's stages (``flows/send/stages/``, listed in
``flows/send/flow.py``) on its own event loop. Per channel, it bounds the calls in flight
(``max_in_flight``) and the messages waiting (``max_queued``); a channel at its bound raises
its :class:`ChannelPressure` signal and only that channel's source partitions pause. A slow
or broken SMS provider therefore never holds up email or push of the same tier.
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
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from bytewax.operators import StatefulBatchLogic
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation

from notiflow import names, stages, telemetry, tuning
from notiflow.adapters.breaker import StateChange
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.outages import REDIS_DOWN
from notiflow.adapters.ports import OpenSendPorts
from notiflow.adapters.pressure import REPORT_EVERY_S
from notiflow.adapters.providers.chat import breaker_label
from notiflow.adapters.worker import loop_thread, register, stop_loop_thread
from notiflow.flows.common.items import Out, Retry, Work
from notiflow.flows.common.steps import Clock
from notiflow.flows.common.yielding import Slots, YieldWindow
from notiflow.flows.send.ordering import KeyOrder, OrderedState, Skip, order_key, refused_events
from notiflow.flows.send.stages import SendStages
from notiflow.flows.send.stages.admit import count_crash, count_crashes
from notiflow.flows.send.stages.context import InfraUnavailable, SendContext
from notiflow.flows.send.stages.metrics import attempt_outcome, metrics
from notiflow.flows.send.stages.send_batch import Batch, Prepared, attempt_key
from notiflow.names import Stage
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings, TierPolicy
from notiflow.telemetry import header_traceparent

log = logging.getLogger("notiflow.flows.dispatch")

BACKLOG_REPORT_S = 1.0
POLL = timedelta(milliseconds=5)


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


_live: weakref.WeakSet[Dispatcher] = weakref.WeakSet()
"""The dispatchers of this process (observed by the gauges below)."""
_STATE_CODE = {"closed": 0, "half_open": 1, "open": 2}


def _observe_oldest(options: CallbackOptions) -> Iterable[Observation]:
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


def _observe_breakers(options: CallbackOptions) -> Iterable[Observation]:
    """``notiflow.breaker.state`` per provider account this process sends through."""
    for d in list(_live):
        ports = d.ctx.opened
        if ports is not None:
            for provider_id in list(ports.providers):
                state = ports.breakers.state(provider_id)
                yield Observation(_STATE_CODE.get(str(state.value), 0),
                                  {"provider": provider_id, "lane": d.policy.lane})


def _observe_weights(options: CallbackOptions) -> Iterable[Observation]:
    """``notiflow.provider.route_weight`` per provider account this process sends through."""
    for d in list(_live):
        ports = d.ctx.opened
        if ports is not None:
            for provider_id in list(ports.providers):
                yield Observation(ports.breakers.weight(provider_id), {"provider": provider_id})


def _observe_window(options: CallbackOptions) -> Iterable[Observation]:
    """``notiflow.bulk.window`` of each bulk-lane dispatcher."""
    for d in list(_live):
        if d.policy.lane == "bulk":
            yield Observation(d.window.limit / d.window.ceiling, {"tier": d.tier.value})


def _observe_p0_worst(options: CallbackOptions) -> Iterable[Observation]:
    """``notiflow.p0.worst_latency`` of the P0 dispatcher (what it reports)."""
    for d in list(_live):
        if d.tier is Tier.P0 and d.reported is not None:
            yield Observation(d.reported, {"tier": Tier.P0.value})


def _gauges() -> None:
    m = telemetry.meter()
    names.QUEUE_OLDEST_AGE.create(m, callbacks=[_observe_oldest])
    names.BREAKER_STATE.create(m, callbacks=[_observe_breakers])
    names.PROVIDER_ROUTE_WEIGHT.create(m, callbacks=[_observe_weights])
    names.BULK_WINDOW.create(m, callbacks=[_observe_window])
    names.P0_WORST_LATENCY.create(m, callbacks=[_observe_p0_worst])


_gauges()

Future = concurrent.futures.Future[list[Out]]


class Dispatcher:
    """Performs every send of this process on one background event loop.

    Thread-safe :meth:`submit`; outcomes are delivered through ``concurrent.futures`` so the
    Bytewax worker thread never blocks on I/O. ``open_ports`` is awaited on that loop when
    the dispatcher starts (:meth:`start`: by the flow's runner, or by the first submit)."""

    def __init__(self, settings: Settings, tier: Tier, policy: TierPolicy, cipher: DlqCipher,
                 pressure: ChannelPressure, clock: Clock, open_ports: OpenSendPorts,
                 owner: str, stages: SendStages, rng: random.Random | None = None,
                 source: str | None = None, workers: int = 1) -> None:
        self.settings = settings
        self.tier = tier
        self.policy = policy
        self.pressure = pressure
        self.owner = owner
        self.stages = stages
        self.ctx = SendContext(settings, tier, policy, cipher, clock, rng or random.Random(),
                               source or f"send.{tier.value.lower()}", workers)
        self._open_ports = open_ports
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._sems: dict[Channel, Slots] = {}
        self.reported: float | None = None
        self.window = YieldWindow(settings.bulk_yield, settings.policy(Tier.P0).sla
                                  .total_seconds(), policy.max_in_flight)
        """The bulk lane's in-flight window per channel (``flows/common/yielding.py``)."""
        self._retry_sems: dict[Channel, asyncio.Semaphore] = {}
        self._oldest: dict[str, tuple[Tier, float, Channel]] = {}
        register(self)
        _live.add(self)

    @property
    def redis_ok(self) -> bool:
        return self.ctx.redis_ok

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> asyncio.AbstractEventLoop:
        """Start the loop thread and begin opening the ports in the background (idempotent),
        so the first P0 message finds a warm sender."""
        with self._lock:
            if self._loop is None:
                loop, self._thread = loop_thread(f"dispatch-{self.ctx.source}")
                self._opened = asyncio.run_coroutine_threadsafe(self._open(), loop)
                asyncio.run_coroutine_threadsafe(self._report_backlog(), loop)
                if self.tier is Tier.P0:
                    asyncio.run_coroutine_threadsafe(self._report_pressure(), loop)
                elif self.policy.lane == "bulk":
                    asyncio.run_coroutine_threadsafe(self._follow_pressure(), loop)
                self._loop = loop
            return self._loop

    async def _open(self) -> None:
        ports = await self._open_ports()
        self.ctx.attach(ports)
        ports.breakers.on_change(self._breaker_changed)
        try:
            self.ctx.crashes = await ports.leases.crashes(self.ctx.source)
        except REDIS_DOWN as exc:
            log.warning("crash counts not read: %r", exc)
        self._sems = {c: Slots(self.policy.max_in_flight) for c in Channel}
        retry_slots = max(1, int(self.policy.max_in_flight * self.settings.retry_share))
        self._retry_sems = {c: asyncio.Semaphore(retry_slots) for c in Channel}
        tuning.settle()
        log.info("dispatcher ready: providers %s", ", ".join(sorted(ports.providers)) or
                 "none")

    def _breaker_changed(self, change: StateChange) -> None:
        log.warning("circuit breaker %s", change)
        if change.shared:
            metrics.breaker_transitions.add(1, {
                "provider": breaker_label(change.provider_id),
                "lane": change.lane or "priority",
                "from": change.old.value, "to": change.new.value,
                "why": change.why.split(":", 1)[0]})

    def close(self) -> None:
        """Stop the loop and release the ports (pending sends are abandoned: they are in the
        flow's snapshot and resume on restart)."""
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            me = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not me:
                    task.cancel()
            if self.ctx.opened is not None:
                await self.ctx.opened.close()

        stop_loop_thread(loop, self._thread, shutdown(), log, "dispatcher")
        self._loop = None

    # ------------------------------------------------------------------ submission

    def submit(self, batch: list[Work]) -> list[Future]:
        """Start sending ``batch``; one future per message, resolving to its outputs."""
        loop = self.start()
        futures: list[Future] = [concurrent.futures.Future() for _ in batch]
        for w in batch:
            self.pressure.add(w.record.channel)
            self._oldest[attempt_key(w)] = (w.record.tier, w.accepted_at.timestamp(),
                                            w.record.channel)
        submitted = time.time()
        loop.call_soon_threadsafe(functools.partial(self._spawn, batch, futures, submitted))
        return futures

    def _spawn(self, batch: list[Work], futures: list[Future], submitted: float) -> None:
        asyncio.get_running_loop().create_task(self._batch(batch, futures, submitted))

    def _resolve(self, w: Work, fut: Future, outs: list[Out] | BaseException) -> None:
        self.pressure.done(w.record.channel)
        self._oldest.pop(attempt_key(w), None)
        if fut.done():
            return
        if isinstance(outs, BaseException):
            fut.set_exception(outs)
        else:
            fut.set_result(outs)

    # ------------------------------------------------------------------ signals

    async def _report_pressure(self) -> None:
        """P0's worst latency (completed in the last second, or held now) for the bulk lane
        to yield by (``adapters/pressure.py``)."""
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            ports = self.ctx.opened
            if ports is None:
                continue
            now = time.time()
            held = [at for tier, at, _ in list(self._oldest.values()) if tier is Tier.P0]
            worst = self.ctx.p0_latencies.worst(now - min(held) if held else None)
            self.reported = worst
            if worst is None:
                continue
            with contextlib.suppress(*REDIS_DOWN):
                await ports.boards.report_p0_worst(worst)

    async def _follow_pressure(self) -> None:
        """Bulk lane: resize every channel's in-flight slots by P0's latency signal; no
        signal (Redis down, no P0 traffic) counts as calm."""
        tick = self.settings.bulk_yield.tick.total_seconds()
        while True:
            await asyncio.sleep(tick)
            ports = self.ctx.opened
            if ports is None:
                continue
            try:
                worst = await ports.boards.p0_worst()
            except REDIS_DOWN:
                worst = None
            limit = self.window.step(worst)
            self.pressure.share = limit / self.window.ceiling
            for slots in self._sems.values():
                slots.resize(limit)

    async def _report_backlog(self) -> None:
        while True:
            await asyncio.sleep(BACKLOG_REPORT_S)
            ports = self.ctx.opened
            if ports is None:
                continue
            waiting = list(self._oldest.values())
            tiers = {self.tier} | {t for t, _, _ in waiting}
            try:
                for tier in tiers:
                    oldest = min((at for t, at, _ in waiting if t is tier), default=None)
                    await ports.boards.report_backlog(tier, oldest)
            except REDIS_DOWN:
                pass

    # ------------------------------------------------------------------ the send step

    async def _batch(self, works: list[Work], futures: list[Future], submitted: float) -> None:
        started = time.time()
        opened = self.ctx.opened is not None
        try:
            if not opened:
                await asyncio.wrap_future(self._opened)
                opened = True
            batch = await self.prepare(works)
        except Exception as exc:
            log.exception("send preparation failed")
            if opened:
                await count_crashes(self.ctx, works, exc)
            for w, fut in zip(works, futures, strict=True):
                self._resolve(w, fut, exc)
            return
        prepared = time.time()
        ready = {attempt_key(p.work): p for p in batch.prepared()}
        for w, fut in zip(works, futures, strict=True):
            item = ready.get(attempt_key(w))
            if item is None:
                self._resolve(w, fut, batch.decided[attempt_key(w)])
            else:
                budget_until_prepared(w, submitted, started, prepared)
                asyncio.get_running_loop().create_task(self._send(item, fut))

    async def prepare(self, works: list[Work]) -> Batch:
        """Run the preparing stages over ``works``: every message ends decided or rendered."""
        batch = Batch(list(works), self.ctx.clock())
        for stage in self.stages.prepare:
            if not batch.live:
                break
            await stage(batch, self.ctx)
            batch.settle()
        return batch

    async def _send(self, item: Prepared, fut: Future) -> None:
        """The per-message stages: ``route``, then ``send`` inside the channel's in-flight
        bound (the provider call and its outcome recorded on the lease), so at most
        ``max_in_flight`` sends per channel are unrecorded when the process dies. Retries
        (attempt > 1) also pass a gate of ``retry_share`` of that bound, so a retry storm
        cannot starve new traffic."""
        w = item.work
        r = w.record
        gate = self._retry_sems[r.channel] if r.attempt > 1 else contextlib.nullcontext()
        attrs = {names.ATTR_MESSAGE_ID: w.message_id, names.ATTR_TENANT_ID: r.tenant_id,
                 names.ATTR_TIER: r.tier.value, names.ATTR_CHANNEL: r.channel.value,
                 names.ATTR_ATTEMPT: r.attempt}
        entered = time.monotonic()
        async with gate:
            with telemetry.span(names.SEND, attrs, parent=header_traceparent(w.headers)):
                try:
                    self._resolve(w, fut, await self._attempt(item, entered))
                except Exception as exc:
                    log.exception("send of %s failed", w.message_id)
                    if not isinstance(exc, (InfraUnavailable, *REDIS_DOWN)):
                        await count_crash(self.ctx, w)
                    self._resolve(w, fut, exc)

    async def _attempt(self, item: Prepared, entered: float) -> list[Out]:
        """Run the per-message stages until one ends the message (a stage that passes at
        once is not awaited)."""
        ctx = self.ctx
        outs: list[Out] | None = None
        for stage in self.stages.route:
            step = stage(item, ctx)
            if step is not None and (outs := await step) is not None:
                break
        item.routed = time.monotonic()
        stages.record(item.work.record.tier.value, Stage.DISPATCH_ROUTE, item.routed - entered)
        if outs is not None:
            return outs
        async with self._sems[item.work.record.channel]:
            for stage in self.stages.send:
                step = stage(item, ctx)
                if step is not None and (outs := await step) is not None:
                    break
            if item.result is not None and item.provider is not None:
                trace.get_current_span().set_attributes({
                    names.ATTR_PROVIDER: item.provider.provider_id,
                    names.ATTR_OUTCOME: attempt_outcome(item.result)})
        return [] if outs is None else outs


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


SendIn = Work | Skip
SendState = list[Work] | OrderedState


def send_key(item: SendIn, shards: int) -> str:
    """The send step's key: the order key of a message with an ``ordering_key`` (one
    message of the key at a time, in order), else ``{channel}:{shard}``."""
    w = item.work if isinstance(item, Skip) else item
    return order_key(w.record) or shard_key(w, shards)


def retried(w: Work, outs: list[Out]) -> bool:
    """Whether ``outs`` hold a next record of ``w`` (a retry, a check, a wait)."""
    return any(isinstance(o, Retry) and o.record.message_id == w.message_id for o in outs)


class SendLogic(StatefulBatchLogic[SendIn, Out, SendState]):
    """Keyed by :func:`send_key`. State: the messages handed to the dispatcher whose outcome
    has not been emitted yet (resubmitted on resume), and for an order key its
    :class:`~notiflow.flows.send.ordering.KeyOrder`, which releases one message at a time.

    At most one submission per (message, attempt) is pending here, and its future is the one
    whose outcome is emitted: a copy of a pending attempt is dropped, whether it arrives in a
    later batch or in the same one (a replay after a crash re-reads a retry record and
    re-emits it from the dedup lease; both copies are held until the same ``not_before``).
    The dispatcher answers a copy whose lease this process holds with no outputs, so a copy's
    future must never take the place of the attempt's own."""

    def __init__(self, dispatcher: Dispatcher, resume: SendState | None,
                 eof_timeout: float = 120.0, idle: timedelta = timedelta(hours=1)) -> None:
        self.d = dispatcher
        self.pending: dict[str, tuple[Work, concurrent.futures.Future[list[Out]]]] = {}
        self._done: collections.deque[str] = collections.deque()
        """Keys whose future finished (appended by the future's callback, any thread), so a
        collect costs what finished, not what is pending."""
        self.eof_timeout = eof_timeout
        self.idle = idle
        self.order: KeyOrder | None = None
        if isinstance(resume, OrderedState):
            self.order = resume.order
            resume = resume.in_flight
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

    def _ordered(self) -> KeyOrder:
        if self.order is None:
            self.order = KeyOrder(cap=self.d.settings.ordering_max_waiting)
        return self.order

    def _collect(self) -> list[Out]:
        out: list[Out] = []
        while self._done:
            entry = self.pending.pop(self._done.popleft(), None)
            if entry is None:
                continue
            w, fut = entry
            outs = fut.result()
            out.extend(outs)
            if self.order is not None and w.record.order_seq is not None:
                self._submit(self.order.ended(w, retried(w, outs)))
        if self.order is not None and self.order.refused:
            out.extend(refused_events(self.order, datetime.now(UTC)))
        return out

    def _keep(self) -> bool:
        if self.pending or (self.order is not None and (
                not self.order.idle() or datetime.now(UTC) < self.order.last_at + self.idle)):
            return StatefulBatchLogic.RETAIN
        return StatefulBatchLogic.DISCARD

    def on_batch(self, values: list[SendIn]) -> tuple[Iterable[Out], bool]:
        release: list[Work] = []
        for v in values:
            if isinstance(v, Skip):
                release += self._ordered().skip(v.work)
            elif v.record.order_seq is not None:
                release += self._ordered().offer(v)
            else:
                release.append(v)
        self._submit(release)
        return self._collect(), self._keep()

    def on_notify(self) -> tuple[Iterable[Out], bool]:
        return self._collect(), self._keep()

    def on_eof(self) -> tuple[Iterable[Out], bool]:
        """Finite input (tests): wait for the messages still in flight, and for those an
        order key releases after them."""
        deadline = time.monotonic() + self.eof_timeout
        out: list[Out] = []
        while self.pending and time.monotonic() < deadline:
            concurrent.futures.wait([f for _, f in self.pending.values()],
                                    timeout=max(0.0, deadline - time.monotonic()),
                                    return_when=concurrent.futures.FIRST_COMPLETED)
            out += self._collect()
        return out, self._keep()

    def notify_at(self) -> datetime | None:
        if self.pending:
            return datetime.now(UTC) + POLL
        return self.order.last_at + self.idle if self.order is not None else None

    def snapshot(self) -> SendState:
        in_flight = [w for w, _ in self.pending.values()]
        if self.order is not None:
            return OrderedState(self.order, in_flight)
        return in_flight
