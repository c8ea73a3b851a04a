"""The outbox sweeper: publishes acceptances left ``PENDING`` (a crash, a lost connection).

It keeps a cursor per shard (``outbox_cursor``): the first bucket that may still hold rows.
Each round it reads the buckets from the cursor to the newest one old enough to sweep,
settles what it finds, and moves the cursor past the buckets it left empty. A round thus
reads the pending rows and the deletion tombstones of a few buckets, whatever the history.
While this process's Kafka-outage window sees Kafka down, rounds are skipped: nothing could
be published.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from notiflow.adapters.cassandra.idempotency import (
    OUTBOX_READ_LIMIT,
    OUTBOX_SHARDS,
    OutboxRow,
    OutboxSlot,
)
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.envelope import envelope, load
from notiflow.adapters.retrying import every
from notiflow.gateway.outbox import MIN_SWEEP_AGE, PENDING, complete_acceptance, traceparent
from notiflow.gateway.runtime import Runtime

log = logging.getLogger("notiflow.gateway.outbox")

SWEEP_INTERVAL = timedelta(seconds=5)
MIN_SWEEP_INTERVAL_S = 1.0
MAX_BUCKETS_PER_ROUND = 360
"""Buckets one sweep round reads per shard at most (an hour's; a sweeper that was down
longer catches up over several rounds)."""


class OutboxSweeper:
    """Publishes ``PENDING`` idempotency records whose outbox row is older than
    ``max(scaled(outbox_sweep_after), MIN_SWEEP_AGE)``, then marks them ``ACCEPTED``; rows
    that cannot be published (no payload) are parked in ``outbox_parked`` for an operator.
    Drains the legacy ``outbox_pending`` table until a round finds it empty; a failure there
    (its reads cross the history's tombstones) never holds up the buckets."""

    def __init__(self, rt: Runtime, clock: Callable[[], datetime] | None = None) -> None:
        self.rt = rt
        s = rt.settings
        self.interval_s = max(MIN_SWEEP_INTERVAL_S, s.scaled(SWEEP_INTERVAL).total_seconds())
        self.min_age = max(s.scaled(s.outbox_sweep_after), MIN_SWEEP_AGE)
        self.clock = clock or (lambda: datetime.now(UTC))
        self.cursors: dict[int, int] = {}
        self.legacy_done = False
        self.reads = 0
        """Partition reads made (tests and benchmarks compare them with the pending rows)."""

    async def run(self) -> None:
        """Sweep forever; errors are logged and the next round tries again."""
        await every("outbox sweep, entries settled", self.interval_s, self.sweep_once, log)

    def last_bucket(self, now: datetime) -> int:
        """The newest bucket whose rows are all older than ``min_age`` plus one bucket of
        margin (a row is written up to a request's lifetime after its bucket began)."""
        return OutboxSlot.bucket_of(now - self.min_age) - 2

    async def sweep_once(self, now: datetime | None = None) -> int:
        """One pass over every shard; returns the number of outbox rows settled."""
        if not self.rt.connected or self.rt.window.down:
            return 0
        store = self.rt.store()
        now = now or self.clock()
        done = 0
        if not self.legacy_done:
            try:
                done += await self._legacy(store, now)
            except Exception as exc:
                log.warning("outbox_pending (legacy) not drained this round, retried next "
                            "round: %s: %s", type(exc).__name__, exc)
        counts = await asyncio.gather(*(self._shard(store, shard, now)
                                        for shard in range(OUTBOX_SHARDS)))
        return done + sum(counts)

    async def _shard(self, store: CassandraStore, shard: int, now: datetime) -> int:
        last = self.last_bucket(now)
        if shard not in self.cursors:
            self.cursors[shard] = await store.idempotency.outbox_cursor(shard, last)
        first = bucket = self.cursors[shard]
        done = 0
        end = min(last, bucket + MAX_BUCKETS_PER_ROUND - 1)
        try:
            while bucket <= end:
                slot = OutboxSlot(bucket, shard)
                rows = await store.idempotency.outbox_rows(slot)
                self.reads += 1
                settled = 0
                for row in rows:
                    settled += await self._settle(store, slot, row, now)
                done += settled
                if settled < len(rows) or len(rows) == OUTBOX_READ_LIMIT:
                    break
                bucket += 1
        finally:
            if bucket > first:
                self.cursors[shard] = bucket
                await store.idempotency.outbox_advance(shard, bucket)
        return done

    async def _legacy(self, store: CassandraStore, now: datetime) -> int:
        """Settle the rows of ``outbox_pending`` (written before the buckets existed) older
        than ``min_age``; once a pass finds none left, stop reading it."""
        done, left = 0, 0
        for shard in range(OUTBOX_SHARDS):
            slot = OutboxSlot(None, shard)
            rows = await store.idempotency.outbox_rows(slot)
            self.reads += 1
            for row in rows:
                if row.created_at > now - self.min_age:
                    left += 1
                    continue
                ok = await self._settle(store, slot, row, now)
                done += ok
                left += 1 - ok
        self.legacy_done = left == 0
        return done

    async def _settle(self, store: CassandraStore, slot: OutboxSlot, row: OutboxRow,
                      now: datetime) -> int:
        """1 when the row is gone (published, already settled, or parked), else 0."""
        created_at, tenant_id, key = row.created_at, row.tenant_id, row.idempotency_key
        rec = await store.idempotency.get_reservation(tenant_id, key)
        if rec is None or rec.state != PENDING:
            await store.idempotency.outbox_remove(slot, created_at, tenant_id, key)
            return 1
        payload, topic = rec.payload, rec.topic
        try:
            if not payload or not topic:
                raise ValueError("reservation has no payload or topic")
            record = load(payload, envelope(self.rt.settings))
        except ValueError as exc:
            log.error("outbox entry %s/%s cannot be published (%s); parked in outbox_parked "
                      "for an operator", tenant_id, key, type(exc).__name__)
            await store.idempotency.outbox_park(slot, created_at, tenant_id, key,
                                                type(exc).__name__, now)
            return 1
        if await self.rt.topic_exists(topic) is False:
            log.error("outbox entry %s/%s is bound for topic %s, which does not exist; parked "
                      "in outbox_parked for an operator", tenant_id, key, topic)
            await store.idempotency.outbox_park(slot, created_at, tenant_id, key,
                                                "unknown_topic", now)
            return 1
        await complete_acceptance(
            self.rt, tenant_id=tenant_id, key=key, created_at=created_at, record=record,
            topic=topic, payload=payload, trace=traceparent(), slot=slot, write_outbox=False,
            deferrable=False,
        )
        log.info("outbox: published pending message %s", record.message_id)
        return 1
