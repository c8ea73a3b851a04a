"""The Kafka-outage window of one API process (docs/design.md, "Failures of the stores";
docs/api.md, "Kafka outage").

While Kafka does not acknowledge, a P1-P3 acceptance that is durable in Cassandra (key
reserved, message row and outbox row written) is answered ``202`` and its record is
*deferred*: kept by this process and published by :meth:`Publisher.drain` as soon as Kafka
acknowledges again (should the process die first, the outbox sweeper of any process
publishes it). The window is bounded by its count and by the age of its oldest record;
beyond, new acceptances are refused with ``503`` and ``Retry-After`` before anything is
written. A record with an ordering key whose earlier record is deferred is deferred too, so
the drain keeps their order.

P0 is never deferred: it must reach its provider within a second, which no outage allows.
It is refused at once while Kafka is known down, and waits at most ``p0_ack_wait`` for the
ack otherwise; the outcome of such an unconfirmed record is concluded in the background
(settled when acknowledged, the acceptance undone when not).

Kafka counts as down from a failed delivery or an ack not received within the request's
wait, and as up from any acknowledged record or, with nothing deferred, a metadata answer.
P0 records travel through a producer of their own (``runtime.py``), so a P1-P3 record's
slow ack (a backlog on the shared producer's connection) defers P1-P3 without refusing P0;
a failed delivery or a P0 record's own missed ack refuses P0 too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from enum import Enum
from typing import Any

from notiflow.adapters.kafka_io import AsyncProducer, DeliveryFailed, OutRecord
from notiflow.adapters.retrying import every
from notiflow.schemas.enums import Tier
from notiflow.settings import OutageWindow

log = logging.getLogger("notiflow.gateway.kafka_window")

Conclude = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Deferred:
    """One ingest record on its way to Kafka, with what completes its acceptance."""

    message_id: str
    tier: Tier
    record: OutRecord
    settle: Conclude
    """Marks the key ``ACCEPTED`` and drops the outbox row (failures left to the sweeper)."""
    ordered: bool = False
    """The record carries an ordering key (its Kafka key is shared with other records)."""

    @property
    def order_key(self) -> tuple[str, bytes] | None:
        if not self.ordered or self.record.key is None:
            return None
        return (self.record.topic, self.record.key)


class Window:
    """Kafka's state as this process saw it, and the deferred records (oldest first). Pure:
    the clock is injected."""

    def __init__(self, policy: OutageWindow, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self.clock = clock
        self.down_since: float | None = None
        self.p0_down = False
        """P0 is refused at once (a failed delivery, or a P0 record's missed ack)."""
        self._entries: OrderedDict[str, tuple[Deferred, float]] = OrderedDict()
        self._order_keys: Counter[tuple[str, bytes]] = Counter()

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def mark_down(self, why: str, *, p0: bool = True) -> None:
        """``p0`` False: the evidence is a P1-P3 record's slow ack, which says nothing of
        P0's own connection; P0 goes on being published."""
        news = self.down_since is None or (p0 and not self.p0_down)
        if self.down_since is None:
            self.down_since = self.clock()
        self.p0_down = self.p0_down or p0
        if news:
            log.warning("kafka is not acknowledging (%s): P1-P3 acceptances are deferred "
                        "(window: %d records, %.0f s)%s", why, self.policy.max_messages,
                        self.policy.max_age.total_seconds(),
                        ", P0 is refused" if self.p0_down else "")

    def mark_up(self) -> None:
        if self.down_since is not None:
            log.warning("kafka acknowledges again after %.1f s; %d deferred records to "
                        "publish", self.clock() - self.down_since, len(self._entries))
            self.down_since = None
        self.p0_down = False

    def __len__(self) -> int:
        return len(self._entries)

    def oldest_age(self) -> float:
        """Seconds the oldest deferred record has waited (0 when none)."""
        for _, since in self._entries.values():
            return self.clock() - since
        return 0.0

    def full(self) -> bool:
        """No room for another deferred record (count or age reached)."""
        p = self.policy
        return (len(self._entries) >= p.max_messages
                or (bool(self._entries) and self.oldest_age() >= p.max_age.total_seconds()))

    def refusal(self, tier: Tier) -> str | None:
        """Why a new acceptance of ``tier`` must be refused before anything is written:
        ``kafka_unavailable`` for P0 while Kafka is down for P0, ``outage_window_full`` for
        P1-P3 while it is down and the window is full; None to go ahead."""
        if tier is Tier.P0:
            return "kafka_unavailable" if self.p0_down else None
        return "outage_window_full" if self.down and self.full() else None

    def retry_after_s(self) -> int:
        """Seconds a refused client should wait: a probe interval, at least 1."""
        return max(1, round(self.policy.probe_interval.total_seconds()))

    def blocked(self, d: Deferred) -> bool:
        """An earlier record with the same ordering key is still deferred."""
        key = d.order_key
        return key is not None and self._order_keys[key] > 0

    def defer(self, d: Deferred) -> None:
        if d.message_id in self._entries:
            return
        self._entries[d.message_id] = (d, self.clock())
        if (key := d.order_key) is not None:
            self._order_keys[key] += 1

    def release(self, message_id: str) -> bool:
        """Forget a published record; True when it was deferred."""
        entry = self._entries.pop(message_id, None)
        if entry is None:
            return False
        if (key := entry[0].order_key) is not None:
            self._order_keys[key] -= 1
            if self._order_keys[key] <= 0:
                del self._order_keys[key]
        return True

    def deferred(self) -> list[Deferred]:
        """The deferred records, oldest first."""
        return [d for d, _ in self._entries.values()]


class Outcome(Enum):
    PUBLISHED = "published"
    DEFERRED = "deferred"


class Unconfirmed(Exception):
    """A P0 record was not acknowledged within ``p0_ack_wait``: refuse the request (503);
    its acceptance is concluded in the background."""


class Publisher:
    """Publishes ingest records through the window (one per API process)."""

    def __init__(self, window: Window, producer: Callable[[Tier], AsyncProducer],
                 spawn: Callable[[Coroutine[Any, Any, None], str], None],
                 probe: Callable[[], Awaitable[bool]]) -> None:
        self.window = window
        self.producer = producer
        """The producer of a tier's records."""
        self.spawn = spawn
        self.probe = probe

    def _wait_s(self, tier: Tier) -> float:
        p = self.window.policy
        return (p.p0_ack_wait if tier is Tier.P0 else p.ack_wait).total_seconds()

    async def publish(self, d: Deferred, undo: Conclude, *, deferrable: bool = True) -> Outcome:
        """``PUBLISHED`` once Kafka acknowledged ``d``; ``DEFERRED`` when the window took it
        (answer ``202``, leave the outbox row); raises :class:`DeliveryFailed` when it was
        definitively not published (the caller undoes the acceptance) and
        :class:`Unconfirmed` for a P0 record still in doubt. ``deferrable`` False (the
        sweeper): wait for the definitive outcome, never defer."""
        w = self.window
        if not deferrable:
            return await self._produce(d)
        can_defer = d.tier is not Tier.P0
        if can_defer and (w.down or w.blocked(d)) and not w.full():
            w.defer(d)
            return Outcome.DEFERRED
        if w.p0_down if d.tier is Tier.P0 else w.down:
            raise DeliveryFailed("kafka is not acknowledging")
        task = asyncio.ensure_future(self.producer(d.tier).produce(d.record))
        try:
            await asyncio.wait_for(asyncio.shield(task), self._wait_s(d.tier))
        except DeliveryFailed as exc:
            w.mark_down(str(exc))
            if can_defer and not w.full():
                w.defer(d)
                return Outcome.DEFERRED
            raise
        except TimeoutError:
            w.mark_down(f"no ack within {self._wait_s(d.tier):.1f} s", p0=not can_defer)
            if can_defer and not w.full():
                w.defer(d)
                self.spawn(self._conclude(task, d, None), "kafka-window-conclude")
                return Outcome.DEFERRED
            if d.tier is Tier.P0:
                self.spawn(self._conclude(task, d, undo), "kafka-window-conclude")
                raise Unconfirmed(d.message_id) from None
            return await self._settled(task)
        w.mark_up()
        return Outcome.PUBLISHED

    async def _produce(self, d: Deferred) -> Outcome:
        """The sweeper's publish: a failed delivery marks Kafka down only when the broker
        does not answer either (one record bound for a topic that is gone must not make
        every process refuse P0)."""
        try:
            await self.producer(d.tier).produce(d.record)
        except DeliveryFailed as exc:
            if not await self.probe():
                self.window.mark_down(str(exc))
            raise
        self.window.mark_up()
        return Outcome.PUBLISHED

    async def _settled(self, ack: Awaitable[Any]) -> Outcome:
        try:
            await ack
        except DeliveryFailed as exc:
            self.window.mark_down(str(exc))
            raise
        self.window.mark_up()
        return Outcome.PUBLISHED

    async def _conclude(self, task: asyncio.Future[Any], d: Deferred,
                        undo: Conclude | None) -> None:
        """The in-doubt record's outcome: acknowledged → settle (and release it from the
        window); failed → undo (P0), or leave it deferred for the drain."""
        try:
            await task
        except DeliveryFailed as exc:
            self.window.mark_down(str(exc))
            if undo is not None:
                await undo()
            return
        self.window.mark_up()
        if undo is not None or self.window.release(d.message_id):
            await d.settle()

    async def drain(self) -> None:
        """Forever: every probe interval, publish the deferred records once Kafka
        acknowledges (or probe it when nothing is deferred)."""
        await every("kafka window drain, deferred records published",
                    self.window.policy.probe_interval.total_seconds(), self.drain_once, log)

    async def drain_once(self) -> int:
        """Publish what is deferred, oldest first, the first one alone (the probe); returns
        how many were published."""
        w = self.window
        pending = w.deferred()
        if not pending:
            if w.down and await self.probe():
                w.mark_up()
            return 0
        try:
            await self._produce(pending[0])
        except DeliveryFailed:
            return 0
        await self._done(pending[0])
        gate = asyncio.Semaphore(w.policy.drain_concurrency)

        async def one(d: Deferred) -> int:
            async with gate:
                try:
                    await self._produce(d)
                except DeliveryFailed:
                    return 0
                await self._done(d)
                return 1

        results = await asyncio.gather(*(one(d) for d in pending[1:]))
        return 1 + sum(results)

    async def _done(self, d: Deferred) -> None:
        if self.window.release(d.message_id):
            await d.settle()
