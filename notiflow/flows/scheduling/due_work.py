"""The scheduler: publishes the P2/P3 messages waiting in ``scheduled_work`` when they fall due.

A plain asyncio process, not a Bytewax dataflow: its input is a set of Cassandra partitions
that any of several processes may own, claimed and renewed through leases, and Cassandra
holds all its state (which rows were released, how far each shard has read). Bytewax
assigns partitions to the workers of one cluster statically and keeps progress in its own
recovery store, which would add a second source of truth and tie the schedulers together.

Recipe, per tick of each loop:

    leases (every lease/4)   heartbeat as a member; renew every held shard in one
                             conditional batch (with each shard's watermark); give up the
                             shards above the fair share ceil(shards / live members); claim
                             free or expired shards up to it
    release (every poll)     per held shard, from its watermark bucket to the current one:
                             read due rows past the last position, skip released ones,
                             re-check expiry (expired → EXPIRED event instead of a send),
                             publish each ingest record and wait for Kafka's acks, then mark
                             the rows released; a bucket wholly in the past and read to its
                             end moves the watermark on

A crash between publish and mark publishes those rows again from the next owner, once; the
send flow's dedup lease absorbs the copy. A row can only land in a bucket before its due
time (the API writes rows due at least ``min_lead`` ahead, within half of it), so reading
up to now never leaves one behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from pydantic import ValidationError

from notiflow import names, telemetry
from notiflow.adapters.cassandra.values import to_ms
from notiflow.adapters.delayed_intake import Delayed
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.envelope import Sealer, envelope, load
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.scheduled_store import ShardLease
from notiflow.flows.common.items import SourceRef, utcnow
from notiflow.flows.common.runner import run_until_signalled
from notiflow.flows.common.steps import Encoder, dead_letter, snapshot_of
from notiflow.flows.scheduling.recurring import Materializer
from notiflow.ingest_binding import HEADER, Binder, binder, explain
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.schemas.scheduling import ScheduledRow, bucket_of, fair_share
from notiflow.settings import SchedulingRule, Settings

log = logging.getLogger("notiflow.flows.scheduler")
_lateness = names.SCHEDULER_LATENESS.create(telemetry.meter())
_claims_refused = names.INGEST_CLAIMS_REFUSED.create(telemetry.meter())
Clock = Callable[[], datetime]


class Board(Protocol):
    """What the scheduler reads and writes in Cassandra (``adapters/scheduled_store.py``)."""

    async def leases(self) -> list[ShardLease]: ...

    async def claim(self, shard: int, owner: str, until: datetime, now: datetime,
                    exists: bool) -> bool: ...

    async def renew(self, owner: str, until: datetime,
                    watermarks: dict[int, datetime | None]) -> bool: ...

    async def give_up(self, shards: Sequence[int], owner: str, now: datetime,
                      watermarks: dict[int, datetime | None]) -> None: ...

    async def members(self, now: datetime) -> list[str]: ...

    async def heartbeat(self, owner: str, until: datetime) -> None: ...

    async def leave(self, owner: str) -> None: ...

    async def due(self, bucket: datetime, shard: int, after: tuple[datetime, str],
                  until: datetime, limit: int) -> list[ScheduledRow]: ...

    async def mark_released(self, rows: Sequence[ScheduledRow], at: datetime,
                            owner: str) -> None: ...

    async def add(self, row: ScheduledRow, now: datetime) -> None: ...


class Intake(Protocol):
    """``notify.delayed``, read in batches (``adapters/delayed_intake.py``)."""

    async def batch(self, most: int, wait: float) -> list[Delayed]: ...

    async def commit(self, records: list[Delayed]) -> None: ...

    def rewind(self, records: list[Delayed]) -> None: ...


Publish = Callable[[Sequence[OutRecord]], Awaitable[None]]
"""Produce records and return once Kafka acknowledged every one (raises otherwise)."""


@dataclass(slots=True)
class Shard:
    """A held shard: the oldest bucket it may still have unreleased rows in, and how far
    each open bucket was read."""

    watermark: datetime
    positions: dict[datetime, tuple[datetime, str]] = field(default_factory=dict)
    next_at: datetime | None = None
    """When the shard must be read again (None: at the next poll)."""


@dataclass(frozen=True, slots=True)
class Released:
    """What one release pass did (for tests and logs)."""

    published: int = 0
    expired: int = 0
    skipped: int = 0


def parsed(row: ScheduledRow, sealer: Sealer) -> IngestRecord | None:
    try:
        return load(row.payload, sealer)
    except ValueError:
        return None


def _reason(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return str(exc.errors()[0]["msg"])
    return str(exc)


def ingest_record(row: ScheduledRow, sealer: Sealer, binder: Binder) -> OutRecord:
    """The Kafka record of a due row: the accepted payload, keyed as the API keys it, bound
    by the platform key. A payload that no longer parses goes as it is: the send flow's parse
    step dead-letters it with the reason (errors are data; nothing accepted is dropped
    here)."""
    record = parsed(row, sealer)
    key = record.partition_key() if record is not None else row.message_id.encode()
    value = row.payload.encode()
    channel = (record.channel.value if record is not None
               else row.topic.rsplit(".", 2)[-2].upper() if row.topic.count(".") >= 2 else "")
    headers = make_headers(row.message_id, row.tenant_id, row.tier, row.traceparent)
    return OutRecord(topic=row.topic, key=key, value=value,
                     headers=binder.sign(headers, channel, row.tier, value))


def expired_event(row: ScheduledRow, record: IngestRecord, now: datetime) -> StatusEvent:
    """The EXPIRED event of a row whose message expired while it waited."""
    return StatusEvent(
        event_id=StatusEvent.make_id(row.message_id, Status.EXPIRED, 0),
        message_id=row.message_id, tenant_id=record.tenant_id, channel=record.channel,
        tier=record.tier, status=Status.EXPIRED, reason="expired_while_scheduled",
        occurred_at=now, source="scheduler", message=snapshot_of(record))


class Scheduler:
    """One scheduler process's shard leases and releases. ``run`` until ``stop`` is set."""

    def __init__(self, settings: Settings, board: Board, publish: Publish, owner: str,
                 clock: Clock = utcnow, intake: Intake | None = None,
                 materializer: Materializer | None = None) -> None:
        self.settings = settings
        self.intake = intake
        self.materializer = materializer
        self.cipher = DlqCipher.from_settings(settings)
        self.rule: SchedulingRule = settings.scheduling
        self.board = board
        self.publish = publish
        self.owner = owner
        self.clock = clock
        self.encode = Encoder(settings)
        self.binder: Binder = binder(settings)
        self.held: dict[int, Shard] = {}
        self.lease_until: datetime | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Lease and release until ``stop``; then give the shards up for another process."""
        loops = [asyncio.create_task(self._every(self.rule.lease / 4, self.tick_leases, stop))]
        if self.intake is not None:
            loops.append(asyncio.create_task(self._every(timedelta(0), self.tick_intake, stop)))
        if self.materializer is not None:
            loops.append(asyncio.create_task(self._every(
                self.rule.materialize_every, self.tick_recurring, stop)))
        try:
            await self._every(self.rule.poll, self.tick_release, stop)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self.shutdown()

    async def _every(self, period: timedelta, tick: Callable[[], Awaitable[object]],
                     stop: asyncio.Event) -> None:
        while not stop.is_set():
            pause = period
            try:
                await tick()
            except Exception as exc:
                log.warning("scheduler %s: %s: %r", tick.__name__, type(exc).__name__, exc)
                pause = max(period, self.rule.poll)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause.total_seconds())

    def holds(self, now: datetime) -> bool:
        """Whether this process's leases are still valid (with a tenth of a lease spare)."""
        return self.lease_until is not None and now < self.lease_until - self.rule.lease / 10

    # ------------------------------------------------------------------ leases

    def watermarks(self) -> dict[int, datetime | None]:
        return {s: st.watermark for s, st in self.held.items()}

    async def tick_leases(self) -> None:
        """Heartbeat, renew, then move towards the fair share."""
        now = self.clock()
        until = now + self.rule.lease
        await self.board.heartbeat(self.owner, until)
        if self.held and not await self.board.renew(self.owner, until, self.watermarks()):
            await self._drop_lost(now)
            if self.held and not await self.board.renew(self.owner, until, self.watermarks()):
                self.held.clear()
        if self.held:
            self.lease_until = until
        members = set(await self.board.members(now)) | {self.owner}
        target = fair_share(self.rule.shards, len(members))
        if len(self.held) > target:
            extra = sorted(self.held)[target:]
            await self.board.give_up(extra, self.owner, now, self.watermarks())
            for s in extra:
                del self.held[s]
            log.info("scheduler %s: gave up shards %s (fair share %d)", self.owner, extra,
                     target)
        if len(self.held) < target:
            await self._claim(now, until, target)

    async def _drop_lost(self, now: datetime) -> None:
        for lease in await self.board.leases():
            if lease.shard in self.held and lease.owner != self.owner:
                del self.held[lease.shard]
                log.warning("scheduler %s: lost shard %d to %s", self.owner, lease.shard,
                            lease.owner)

    async def _claim(self, now: datetime, until: datetime, target: int) -> None:
        known = {lease.shard: lease for lease in await self.board.leases()}
        for shard in range(self.rule.shards):
            if len(self.held) >= target:
                break
            lease = known.get(shard)
            if shard in self.held or (lease is not None and lease.lease_until is not None
                                      and lease.lease_until >= now
                                      and lease.owner != self.owner):
                continue
            if await self.board.claim(shard, self.owner, until, now, exists=lease is not None):
                start = (lease.watermark if lease is not None and lease.watermark
                         else bucket_of(now - self.rule.lookback, self.rule.bucket))
                self.held[shard] = Shard(start)
                self.lease_until = until
                log.info("scheduler %s: claimed shard %d from %s", self.owner, shard,
                         start.isoformat())

    async def shutdown(self) -> None:
        """Give every held shard up now and leave the members (a clean stop)."""
        if self.held:
            await self.board.give_up(sorted(self.held), self.owner, self.clock(),
                                     self.watermarks())
            self.held.clear()
        await self.board.leave(self.owner)

    # ------------------------------------------------------------------ recurring

    async def tick_recurring(self) -> int:
        """Materialise the recurring schedules of the held shards
        (``flows/scheduling/recurring.py``)."""
        if self.materializer is None or not self.holds(self.clock()):
            return 0
        return await self.materializer.tick(sorted(self.held))

    # ------------------------------------------------------------------ intake

    async def tick_intake(self) -> int:
        """Move one batch of ``notify.delayed`` into buckets (a record due within
        ``min_lead`` goes to its ingest topic instead; one that does not parse, or is not
        bound to the tenant it names (``tenant_claim_refused``), to the DLQ), then commit
        it. A batch that fails is read again."""
        assert self.intake is not None
        batch = await self.intake.batch(self.rule.page, self.rule.poll.total_seconds())
        if not batch:
            return 0
        now = self.clock()
        rows: list[ScheduledRow] = []
        direct: list[OutRecord] = []
        for d in batch:
            item = self._placed(d, now)
            (rows if isinstance(item, ScheduledRow) else direct).append(item)  # type: ignore[arg-type]
        limit = self.rule.min_lead.total_seconds() / 2
        try:
            await asyncio.gather(self.publish(direct), *(
                asyncio.wait_for(self.board.add(r, now), limit) for r in rows))
        except BaseException:
            self.intake.rewind(batch)
            raise
        await self.intake.commit(batch)
        return len(batch)

    def _placed(self, d: Delayed, now: datetime) -> ScheduledRow | OutRecord:
        try:
            record = load(d.value, envelope(self.settings))
        except ValueError as exc:
            return self.encode(dead_letter(
                raw=d.value, source=SourceRef(d.topic, d.partition, d.offset, d.timestamp_ms),
                reason=f"delayed record does not parse: {_reason(exc)}",
                error_class=type(exc).__name__, category="invalid_data", tier=None,
                cipher=self.cipher, now=now))
        verdict = self.binder.check(
            record.tenant_id, record.channel.value, record.tier.value, d.value,
            [(HEADER, d.binding)] if d.binding is not None else None)
        if not verdict.bound:
            _claims_refused.add(1, {"flow": "scheduler", "reason": verdict.refusal or ""})
            return self.encode(dead_letter(
                raw=d.value, source=SourceRef(d.topic, d.partition, d.offset, d.timestamp_ms),
                reason=explain(verdict, record.tenant_id), error_class="tenant_claim_refused",
                category="invalid_data", tier=None, cipher=self.cipher, now=now,
                message_id=record.message_id))
        topic = self.settings.ingest_topic(record.channel, record.tier)
        due = record.not_before
        message_id = record.message_id or ""
        if due is None or due - now < self.rule.min_lead or not message_id:
            return OutRecord(topic, record.partition_key(), d.value, self.binder.sign(
                make_headers(message_id, record.tenant_id, record.tier.value, d.traceparent),
                record.channel.value, record.tier.value, d.value))
        return ScheduledRow.waiting(record, to_ms(due), topic, d.value.decode(),
                                    self.rule.bucket, self.rule.shards, d.traceparent)

    # ------------------------------------------------------------------ release

    async def tick_release(self) -> Released:
        """One pass over every held shard (concurrently)."""
        now = self.clock()
        if not self.holds(now):
            return Released()
        done = await asyncio.gather(*(self._release_shard(s, st, now)
                                      for s, st in list(self.held.items())))
        return Released(sum(d.published for d in done), sum(d.expired for d in done),
                        sum(d.skipped for d in done))

    async def _release_shard(self, shard: int, st: Shard, now: datetime) -> Released:
        """Release the shard's due rows, reading ahead by ``min_lead / 2`` to learn when it
        must be read next: no row can appear due sooner (rows are written at least
        ``min_lead`` before their due time, within half of it), so a quiet shard is read once
        a second rather than every poll."""
        if st.next_at is not None and now < st.next_at:
            return Released()
        width = self.rule.bucket
        current = bucket_of(now, width)
        ahead = now + self.rule.min_lead / 2
        bucket = st.watermark
        published = expired = skipped = 0
        st.next_at = min(ahead, current + width)
        while bucket <= current:
            start = (bucket - timedelta(milliseconds=1), "")
            rows = await self.board.due(bucket, shard, st.positions.get(bucket, start), ahead,
                                        self.rule.page)
            due = [r for r in rows if r.scheduled_at <= now]
            if len(due) < len(rows):
                st.next_at = min(st.next_at, rows[len(due)].scheduled_at)
            fresh = [r for r in due if r.released_at is None]
            skipped += len(due) - len(fresh)
            if fresh:
                if not self.holds(self.clock()):
                    st.next_at = None
                    break
                p, e = await self._release(fresh, now)
                published += p
                expired += e
            if due:
                st.positions[bucket] = due[-1].position
            if len(due) == self.rule.page:
                continue
            if bucket < current:
                st.positions.pop(bucket, None)
                bucket = bucket + width
                st.watermark = bucket
            else:
                break
        return Released(published, expired, skipped)

    async def _release(self, rows: list[ScheduledRow], now: datetime) -> tuple[int, int]:
        out: list[OutRecord] = []
        expired = 0
        sealer = envelope(self.settings)
        for r in rows:
            record = (parsed(r, sealer) if r.expires_at is not None and r.expires_at <= now
                      else None)
            if record is not None:
                out.append(self.encode(expired_event(r, record, now)))
                expired += 1
            else:
                out.append(ingest_record(r, sealer, self.binder))
        await self.publish(out)
        released = self.clock()
        await self.board.mark_released(rows, released, self.owner)
        for r in rows:
            _lateness.record(max(0.0, (released - r.scheduled_at).total_seconds()),
                             {"tier": r.tier, "timer": "bucket"})
        return len(rows) - expired, expired


async def serve(settings: Settings, owner: str, stop: asyncio.Event) -> None:
    """Open Cassandra and a confirming Kafka producer (acks=all, idempotent) and schedule
    until ``stop`` is set."""
    from notiflow.adapters.cassandra.session import connect
    from notiflow.adapters.cassandra.store import CassandraStore
    from notiflow.adapters.delayed_intake import DelayedIntake
    from notiflow.adapters.kafka_io import AsyncProducer
    from notiflow.adapters.schedule_store import ScheduleStore
    from notiflow.adapters.scheduled_store import ScheduledStore

    cluster, session = await asyncio.to_thread(connect, settings)
    producer = AsyncProducer(settings)
    intake = DelayedIntake(settings)
    publish = producer.produce_all

    try:
        board = ScheduledStore(session, settings)
        materializer = Materializer(settings, ScheduleStore(session, settings),
                                    CassandraStore(session, settings).messages, board, publish,
                                    utcnow)
        log.info("scheduler %s: %d shards, buckets of %ss, lease %ss", owner,
                 settings.scheduling.shards, settings.scheduling.bucket.total_seconds(),
                 settings.scheduling.lease.total_seconds())
        await Scheduler(settings, board, publish, owner, intake=intake,
                        materializer=materializer).run(stop)
    finally:
        await asyncio.to_thread(intake.close)
        await asyncio.to_thread(producer.close)
        cluster.shutdown()


def main(settings: Settings, owner: str) -> None:
    """Run one scheduler process until SIGTERM or SIGINT (then its shards are given up at
    once, so another scheduler takes them over without waiting for the lease to lapse)."""
    run_until_signalled(settings, "scheduler", owner, serve)
