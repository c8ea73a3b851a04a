"""Durable acceptance of a send request, and the outbox sweeper.

The idempotency record (``PENDING``, holding topic + payload) is the outbox entry; an
``outbox_pending`` row indexes it by age. Acceptance completes when the message row exists
and Kafka acknowledged the ingest record; the record then becomes ``ACCEPTED`` (holding the
``202`` body) and the outbox row is removed. Whatever is left ``PENDING`` (a crash, a lost
connection) is published later by a retried request with the same key or by the sweeper.
Publishing twice is safe: the send flow deduplicates by ``message_id``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
import zlib
from datetime import UTC, datetime, timedelta

from cassandra import OperationTimedOut
from pydantic import ValidationError

from notiflow import names, telemetry
from notiflow.adapters.cassandra_store import OUTBOX_SHARDS, CassandraStore, to_ms, utc
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


def outbox_shard(tenant_id: str, key: str) -> int:
    """Stable shard of an idempotency key in ``outbox_pending`` (same in every process)."""
    return zlib.crc32(f"{tenant_id}\x1f{key}".encode()) % OUTBOX_SHARDS


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
    topic: str, payload: str, trace: str, add_outbox: bool = True, fresh: bool = False,
    stages: StageTimes | None = None,
) -> str:
    """Steps (c)-(f) of acceptance for a reserved key; returns the ``202`` body.

    Raises a Cassandra error or ``DeliveryFailed`` when the record may not have been
    published. Once Kafka acknowledged it the acceptance is durable: later bookkeeping
    failures are logged and left to the sweeper. ``stages`` collects the latency budget's
    ``api.write``, ``api.accept``, ``api.kafka_ack`` and ``api.settle``.
    """
    times = stages or StageTimes()
    store = rt.store()
    shard = outbox_shard(tenant_id, key)
    outbox = [store.outbox_write(shard, created_at, tenant_id, key)] if add_outbox else []
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
                                      created_at=created_at, record=record)
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
                                      created_at=created_at, record=record)


async def settle_published(
    store: CassandraStore, *, tenant_id: str, key: str, created_at: datetime,
    record: IngestRecord,
) -> str:
    """Mark a published record's key ``ACCEPTED`` and drop its outbox row; returns the
    ``202`` body. Failures are logged and left to the sweeper (the acceptance stands)."""
    response = accepted_json(record)
    try:
        await store.settle_reservation(tenant_id, key, response, outbox_shard(tenant_id, key),
                                       created_at)
    except STORE_ERRORS as exc:
        log.warning("message %s published; bookkeeping deferred to the sweeper (%s)",
                    record.message_id, type(exc).__name__)
    return response


async def undo_acceptance(
    store: CassandraStore, *, tenant_id: str, key: str, created_at: datetime,
    record: IngestRecord, scheduled: ScheduledStore | None = None,
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
        await store.outbox_remove(outbox_shard(tenant_id, key), created_at, tenant_id, key)
    except STORE_ERRORS as exc:
        log.warning("could not undo acceptance of %s (%s); the outbox sweeper will publish it",
                    message_id, type(exc).__name__)
    return True


class OutboxSweeper:
    """Publishes ``PENDING`` idempotency records whose outbox row is older than
    ``max(scaled(outbox_sweep_after), MIN_SWEEP_AGE)``, then marks them ``ACCEPTED``."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        s = rt.settings
        self.interval_s = max(MIN_SWEEP_INTERVAL_S, s.scaled(SWEEP_INTERVAL).total_seconds())
        self.min_age = max(s.scaled(s.outbox_sweep_after), MIN_SWEEP_AGE)

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

    async def sweep_once(self, now: datetime | None = None) -> int:
        """One pass over every shard; returns the number of outbox rows settled."""
        if not self.rt.connected:
            return 0
        store = self.rt.store()
        cutoff = (now or datetime.now(UTC)) - self.min_age
        batches = await asyncio.gather(*(store.outbox_due(shard, cutoff)
                                         for shard in range(OUTBOX_SHARDS)))
        done = 0
        for rows in batches:
            for row in rows:
                created_at = utc(row["created_at"])
                if created_at is not None and await self._settle(
                        store, row["shard"], created_at, row["tenant_id"],
                        row["idempotency_key"]):
                    done += 1
        return done

    async def _settle(self, store: CassandraStore, shard: int, created_at: datetime,
                      tenant_id: str, key: str) -> bool:
        rec = await store.get_reservation(tenant_id, key)
        if rec is None or rec.get("state") != PENDING:
            await store.outbox_remove(shard, created_at, tenant_id, key)
            return True
        payload, topic = rec.get("payload"), rec.get("topic")
        try:
            if not payload or not topic:
                raise ValueError("reservation has no payload or topic")
            record = IngestRecord.model_validate_json(payload)
        except (ValidationError, ValueError) as exc:
            log.error("outbox entry %s/%s cannot be published (%s); left for an operator",
                      tenant_id, key, type(exc).__name__)
            return False
        await complete_acceptance(
            self.rt, tenant_id=tenant_id, key=key, created_at=created_at, record=record,
            topic=topic, payload=payload, trace=traceparent(), add_outbox=False,
        )
        log.info("outbox: published pending message %s", record.message_id)
        return True
