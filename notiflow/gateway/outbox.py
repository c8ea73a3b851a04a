"""Durable acceptance of a send request, and the outbox sweeper.

The idempotency record (``PENDING``, holding topic + payload) is the outbox entry; an
``outbox_buckets`` row indexes it by the 10-second bucket it was written in. Acceptance
completes when the message row exists and Kafka acknowledged the ingest record; the record
then becomes ``ACCEPTED`` (holding the ``202`` body) and the outbox row is removed. Whatever
is left ``PENDING`` (a crash, a lost connection) is published later by a retried request with
the same key or by the sweeper. Publishing twice is safe: the send flow deduplicates by
``message_id``.

The sweeper keeps a cursor per shard (``outbox_cursor``): the first bucket that may still hold
rows. Each round it reads the buckets from the cursor to the newest one old enough to sweep,
settles what it finds, and moves the cursor past the buckets it left empty. A round thus reads
the pending rows and the deletion tombstones of a few buckets, whatever the history.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra import OperationTimedOut
from pydantic import ValidationError

from notiflow import names, telemetry
from notiflow.adapters.cassandra_store import (
    OUTBOX_READ_LIMIT,
    OUTBOX_SHARDS,
    CassandraStore,
    OutboxSlot,
    to_ms,
    utc,
)
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.scheduled_store import ScheduledStore
from notiflow.gateway.errors import STORE_ERRORS
from notiflow.gateway.runtime import Runtime
from notiflow.names import Stage
from notiflow.redact import mask, recipient_hash
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import Accepted, IngestRecord, MessageSnapshot
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import Settings
from notiflow.stages import StageTimes

log = logging.getLogger("notiflow.gateway.outbox")

PENDING = "PENDING"
ACCEPTED = "ACCEPTED"
AUTO_KEY_PREFIX = "auto:"
SWEEP_INTERVAL = timedelta(seconds=5)
MIN_SWEEP_INTERVAL_S = 1.0
SCHEDULABLE = frozenset({Tier.P2, Tier.P3})
MIN_SWEEP_AGE = timedelta(seconds=15)
"""Never sweep rows younger than this: a live request (at most one Kafka delivery timeout
plus a few Cassandra round trips) may still own them."""

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


MAX_BUCKETS_PER_ROUND = 360
"""Buckets one sweep round reads per shard at most (an hour's; a sweeper that was down
longer catches up over several rounds)."""


def outbox_shard(tenant_id: str, key: str) -> int:
    """Stable shard of an idempotency key in the outbox (same in every process)."""
    return zlib.crc32(f"{tenant_id}\x1f{key}".encode()) % OUTBOX_SHARDS


ON_TIME = timedelta(seconds=5)
"""An outbox row written within this of its key's ``created_at`` goes to ``created_at``'s
bucket; a later one (a retry resuming an old acceptance, a stalled request) to the bucket of
the moment it is written, so that no row lands in a bucket a sweeper's cursor has passed
(:meth:`OutboxSweeper.last_bucket` keeps a margin of at least this)."""


def outbox_slot(tenant_id: str, key: str, created_at: datetime,
                now: datetime | None = None) -> OutboxSlot:
    """Where the outbox row of a key reserved at ``created_at`` goes when written ``now``."""
    now = now or datetime.now(UTC)
    at = created_at if now - created_at <= ON_TIME else now
    return OutboxSlot(OutboxSlot.bucket_of(at), outbox_shard(tenant_id, key))


def traceparent(incoming: str | None = None) -> str:
    """A W3C ``traceparent`` for the ingest record: the current span's when telemetry
    records one (the API request span, which continued the incoming trace); else continues a
    valid incoming trace (same trace id and flags, new span id), otherwise starts a sampled
    trace."""
    current = telemetry.current_traceparent()
    if current:
        return current
    span = secrets.token_hex(8)
    m = _TRACEPARENT.match((incoming or "").strip().lower())
    if m and m.group(1) != "0" * 32 and m.group(2) != "0" * 16:
        return f"00-{m.group(1)}-{span}-{m.group(3)}"
    return f"00-{secrets.token_hex(16)}-{span}-01"


def ids(record: IngestRecord) -> tuple[str, datetime]:
    """``message_id`` and ``accepted_at`` of a record the API wrote (both always set)."""
    if record.message_id is None or record.accepted_at is None:
        raise ValueError("ingest record lacks message_id or accepted_at")
    return record.message_id, record.accepted_at


def initial_status(record: IngestRecord) -> Status:
    """``SCHEDULED`` while ``scheduled_at`` lies after acceptance, else ``QUEUED``."""
    due = record.scheduled_at
    if due is not None and record.accepted_at is not None and due > record.accepted_at:
        return Status.SCHEDULED
    return Status.QUEUED


def accepted_json(record: IngestRecord) -> str:
    """The ``202`` body; a function of the stored record only, so every replay is identical."""
    message_id, accepted_at = ids(record)
    return Accepted(message_id=message_id, status=initial_status(record),
                    accepted_at=accepted_at).model_dump_json()


def snapshot(record: IngestRecord) -> MessageSnapshot:
    """The message row's content; the recipient only as hash and mask."""
    _, accepted_at = ids(record)
    key = record.recipient_key()
    return MessageSnapshot(
        tenant_id=record.tenant_id, channel=record.channel, tier=record.tier,
        category=record.category, template_id=record.template_id,
        template_version=record.template_version,
        recipient_hash=recipient_hash(record.tenant_id, key), recipient_masked=mask(key),
        accepted_at=accepted_at, expires_at=record.expires_at,
        scheduled_at=record.scheduled_at, idempotency_key=record.idempotency_key,
        ordering_key=record.ordering_key,
        status_webhook=str(record.status_webhook) if record.status_webhook else None,
    )


def partition_key(record: IngestRecord) -> bytes:
    """``message_id``, or ``tenant_id:ordering_key`` when an ordering key is set; raises
    ``ValueError`` for a record the API did not stamp."""
    ids(record)
    return record.partition_key()


def out_record(record: IngestRecord, topic: str, payload: str, trace: str) -> OutRecord:
    return OutRecord(
        topic=topic, key=partition_key(record), value=payload.encode(),
        headers=make_headers(ids(record)[0], record.tenant_id, record.tier.value, trace),
    )


def deferred(settings: Settings, record: IngestRecord, now: datetime) -> bool:
    """Whether the record waits in ``scheduled_work`` rather than Kafka: a P2/P3 message due
    at least ``scheduling.min_lead`` from now (decided when the acceptance completes, so an
    acceptance the outbox finishes late goes straight to Kafka once it is nearly due)."""
    due = record.scheduled_at
    return (due is not None and record.tier in SCHEDULABLE
            and due - now >= settings.scheduling.min_lead)


def scheduled_row(rt: Runtime, record: IngestRecord, topic: str, payload: str, trace: str,
                  now: datetime) -> ScheduledRow | None:
    """The ``scheduled_work`` row of a deferred record, else None."""
    if not deferred(rt.settings, record, now) or record.scheduled_at is None:
        return None
    ids(record)
    rule = rt.settings.scheduling
    return ScheduledRow.waiting(record, to_ms(record.scheduled_at), topic, payload,
                                rule.bucket, rule.shards, trace)


async def schedule(rt: Runtime, row: ScheduledRow, now: datetime) -> None:
    """Write the row within half of ``min_lead`` (``OperationTimedOut`` otherwise, and the
    acceptance fails: a row written later could land behind a scheduler's read position)."""
    limit = rt.settings.scheduling.min_lead.total_seconds() / 2
    try:
        await asyncio.wait_for(rt.scheduled().add(row, now), limit)
    except TimeoutError:
        raise OperationTimedOut(f"scheduled row not written within {limit:.1f} s") from None


async def complete_acceptance(
    rt: Runtime, *, tenant_id: str, key: str, created_at: datetime, record: IngestRecord,
    topic: str, payload: str, trace: str, slot: OutboxSlot, write_outbox: bool = True,
    fresh: bool = False, stages: StageTimes | None = None,
) -> str:
    """Steps (c)-(f) of acceptance for a reserved key; returns the ``202`` body.

    Raises a Cassandra error or ``DeliveryFailed`` when the record may not have been
    published. Once Kafka acknowledged it the acceptance is durable: later bookkeeping
    failures are logged and left to the sweeper. The outbox row is at ``slot`` (written here
    unless ``write_outbox`` is False: the sweeper's call, whose row exists). ``stages``
    collects the latency budget's ``api.write``, ``api.accept``, ``api.kafka_ack`` and
    ``api.settle``.
    """
    times = stages or StageTimes()
    store = rt.store()
    outbox = [store.outbox_write(slot, created_at, tenant_id, key)] if write_outbox else []
    now = datetime.now(UTC)
    row = scheduled_row(rt, record, topic, payload, trace, now)
    with times.timing(Stage.API_WRITE):
        created = store.create_message(ids(record)[0], snapshot(record),
                                       initial_status(record), now, fresh=fresh, also=outbox)
        if row is None:
            await created
        else:
            await asyncio.gather(created, schedule(rt, row, now))
    if row is not None:
        return await settle_published(store, tenant_id=tenant_id, key=key,
                                      created_at=created_at, record=record, slot=slot)
    attrs = {names.ATTR_MESSAGE_ID: ids(record)[0], names.ATTR_TENANT_ID: tenant_id,
             names.ATTR_TIER: record.tier.value, names.ATTR_CHANNEL: record.channel.value,
             "messaging.system": "kafka", "messaging.destination.name": topic}
    parent = None if telemetry.current_traceparent() else trace
    with telemetry.span(names.INGEST_PRODUCE, attrs, parent=parent):
        header = telemetry.current_traceparent() or trace
        times.add(Stage.API_ACCEPT, time.time() - ids(record)[1].timestamp())
        with times.timing(Stage.API_KAFKA_ACK):
            await rt.producer().produce(out_record(record, topic, payload, header))
    with times.timing(Stage.API_SETTLE):
        return await settle_published(store, tenant_id=tenant_id, key=key,
                                      created_at=created_at, record=record, slot=slot)


async def settle_published(
    store: CassandraStore, *, tenant_id: str, key: str, created_at: datetime,
    record: IngestRecord, slot: OutboxSlot,
) -> str:
    """Mark a published record's key ``ACCEPTED`` and drop its outbox row; returns the
    ``202`` body. Failures are logged and left to the sweeper (the acceptance stands)."""
    response = accepted_json(record)
    try:
        await store.settle_reservation(tenant_id, key, response, slot, created_at)
    except STORE_ERRORS as exc:
        log.warning("message %s published; bookkeeping deferred to the sweeper (%s)",
                    record.message_id, type(exc).__name__)
    return response


async def undo_acceptance(
    store: CassandraStore, *, tenant_id: str, key: str, created_at: datetime,
    record: IngestRecord, slot: OutboxSlot, scheduled: ScheduledStore | None = None,
) -> bool:
    """Remove the message row, the reservation and the outbox row of an acceptance whose
    record was not published, and its ``scheduled_work`` row (``scheduled``; a delete newer
    than a write that lands late). Returns False when the message row had already moved past
    ``QUEUED`` (the record reached the send flow after all: the acceptance stands).
    A failure here leaves the outbox row, and the sweeper publishes the record later."""
    message_id, accepted_at = ids(record)
    try:
        if scheduled is not None and record.scheduled_at is not None:
            await scheduled.unschedule(message_id, to_ms(record.scheduled_at))
        if not await store.delete_unsent_message(message_id, tenant_id, accepted_at,
                                                 Status.QUEUED):
            return False
        await store.drop_reservation(tenant_id, key)
        await store.outbox_remove(slot, created_at, tenant_id, key)
    except STORE_ERRORS as exc:
        log.warning("could not undo acceptance of %s (%s); the outbox sweeper will publish it",
                    message_id, type(exc).__name__)
    return True


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
        while True:
            try:
                done = await self.sweep_once()
                if done:
                    log.info("outbox sweeper settled %d entries", done)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("outbox sweep failed: %s: %s", type(exc).__name__, exc)
            await asyncio.sleep(self.interval_s)

    def last_bucket(self, now: datetime) -> int:
        """The newest bucket whose rows are all older than ``min_age`` plus one bucket of
        margin (a row is written up to a request's lifetime after its bucket began)."""
        return OutboxSlot.bucket_of(now - self.min_age) - 2

    async def sweep_once(self, now: datetime | None = None) -> int:
        """One pass over every shard; returns the number of outbox rows settled."""
        if not self.rt.connected:
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
            self.cursors[shard] = await store.outbox_cursor(shard, last)
        first = bucket = self.cursors[shard]
        done = 0
        end = min(last, bucket + MAX_BUCKETS_PER_ROUND - 1)
        try:
            while bucket <= end:
                slot = OutboxSlot(bucket, shard)
                rows = await store.outbox_rows(slot)
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
                await store.outbox_advance(shard, bucket)
        return done

    async def _legacy(self, store: CassandraStore, now: datetime) -> int:
        """Settle the rows of ``outbox_pending`` (written before the buckets existed) older
        than ``min_age``; once a pass finds none left, stop reading it."""
        done, left = 0, 0
        for shard in range(OUTBOX_SHARDS):
            slot = OutboxSlot(None, shard)
            rows = await store.outbox_rows(slot)
            self.reads += 1
            for row in rows:
                created = utc(row["created_at"])
                if created is not None and created > now - self.min_age:
                    left += 1
                    continue
                ok = await self._settle(store, slot, row, now)
                done += ok
                left += 1 - ok
        self.legacy_done = left == 0
        return done

    async def _settle(self, store: CassandraStore, slot: OutboxSlot, row: dict[str, Any],
                      now: datetime) -> int:
        """1 when the row is gone (published, already settled, or parked), else 0."""
        created_at, tenant_id, key = (utc(row["created_at"]), row["tenant_id"],
                                      row["idempotency_key"])
        if created_at is None:
            return 0
        rec = await store.get_reservation(tenant_id, key)
        if rec is None or rec.get("state") != PENDING:
            await store.outbox_remove(slot, created_at, tenant_id, key)
            return 1
        payload, topic = rec.get("payload"), rec.get("topic")
        try:
            if not payload or not topic:
                raise ValueError("reservation has no payload or topic")
            record = IngestRecord.model_validate_json(payload)
        except (ValidationError, ValueError) as exc:
            log.error("outbox entry %s/%s cannot be published (%s); parked in outbox_parked "
                      "for an operator", tenant_id, key, type(exc).__name__)
            await store.outbox_park(slot, created_at, tenant_id, key, type(exc).__name__, now)
            return 1
        await complete_acceptance(
            self.rt, tenant_id=tenant_id, key=key, created_at=created_at, record=record,
            topic=topic, payload=payload, trace=traceparent(), slot=slot, write_outbox=False,
        )
        log.info("outbox: published pending message %s", record.message_id)
        return 1
