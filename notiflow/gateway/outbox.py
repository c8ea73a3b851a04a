"""Durable acceptance of a send request.

The idempotency record (``PENDING``, holding topic + payload) is the outbox entry; an
``outbox_buckets`` row indexes it by the 10-second bucket it was written in. Acceptance
completes when the message row exists and Kafka acknowledged the ingest record; the record
then becomes ``ACCEPTED`` (holding the ``202`` body) and the outbox row is removed. Whatever
is left ``PENDING`` (a crash, a lost connection, a record deferred by the Kafka-outage window
of ``kafka_window.py``) is published later by the window's drain, a retried request with the
same key, or the sweeper (``sweeper.py``). Publishing twice is safe: the send flow
deduplicates by ``message_id``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from cassandra import OperationTimedOut

from notiflow import names, telemetry
from notiflow.adapters.cassandra.idempotency import OUTBOX_SHARDS, OutboxSlot
from notiflow.adapters.cassandra.session import Write
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.cassandra.values import to_ms
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.outages import CASSANDRA_DOWN
from notiflow.adapters.scheduled_store import ScheduledStore
from notiflow.gateway.kafka_window import Deferred, Outcome
from notiflow.gateway.runtime import Runtime
from notiflow.ingest_binding import Binder, binder
from notiflow.names import Stage
from notiflow.redact import mask, recipient_hash
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import Accepted, IngestRecord, MessageSnapshot
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import Settings
from notiflow.stages import StageTimes
from notiflow.stages import record as record_stage

log = logging.getLogger("notiflow.gateway.outbox")

PENDING = "PENDING"
ACCEPTED = "ACCEPTED"
AUTO_KEY_PREFIX = "auto:"
SCHEDULABLE = frozenset({Tier.P2, Tier.P3})
MIN_SWEEP_AGE = timedelta(seconds=15)
"""Never sweep rows younger than this: a live request (at most one Kafka delivery timeout
plus a few Cassandra round trips) may still own them."""

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


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


def out_record(record: IngestRecord, topic: str, payload: str, trace: str,
               binder: Binder) -> OutRecord:
    """The Kafka record of an acceptance, bound by the platform key (``nf-binding``)."""
    value = payload.encode()
    headers = make_headers(ids(record)[0], record.tenant_id, record.tier.value, trace)
    return OutRecord(topic=topic, key=partition_key(record), value=value,
                     headers=binder.sign(headers, record.channel.value, record.tier.value,
                                         value))


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
    fresh: bool = False, stages: StageTimes | None = None, deferrable: bool = True,
    also: Sequence[Write] = (), release: Callable[[], Awaitable[None]] | None = None,
) -> str:
    """Steps (c)-(f) of acceptance for a reserved key; returns the ``202`` body.

    Raises a Cassandra error or ``DeliveryFailed`` when the record may not have been
    published, and ``Unconfirmed`` for a P0 record Kafka did not acknowledge in time. Once
    Kafka acknowledged it, or the Kafka-outage window deferred it (``deferrable``; the
    sweeper's call is not), the acceptance is durable: later bookkeeping failures are logged
    and left to the sweeper. The outbox row is at ``slot`` (written here unless
    ``write_outbox`` is False: the sweeper's call, whose row exists). Once published, the
    settle is queued on ``rt.settler`` (off the response path). ``stages`` collects the
    latency budget's ``api.write``, ``api.accept`` and ``api.kafka_ack``. ``also``: more
    rows written with the message row (a reservation written plainly); ``release``: called
    when a record Kafka did not take is undone (the key's fence).
    """
    times = stages or StageTimes()
    message_id, accepted_at = ids(record)
    store = rt.store()
    writes = [*also]
    if write_outbox:
        writes.append(store.idempotency.outbox_write(slot, created_at, tenant_id, key))
    now = datetime.now(UTC)
    row = scheduled_row(rt, record, topic, payload, trace, now)
    with times.timing(Stage.API_WRITE):
        created = store.messages.create_message(message_id, snapshot(record),
                                                initial_status(record), now, fresh=fresh,
                                                also=writes)
        if row is None:
            await created
        else:
            await asyncio.gather(created, schedule(rt, row, now))
    if row is not None:
        return await settle_published(store, tenant_id=tenant_id, key=key,
                                      created_at=created_at, record=record, slot=slot)
    attrs = {names.ATTR_MESSAGE_ID: message_id, names.ATTR_TENANT_ID: tenant_id,
             names.ATTR_TIER: record.tier.value, names.ATTR_CHANNEL: record.channel.value,
             "messaging.system": "kafka", "messaging.destination.name": topic}
    parent = None if telemetry.current_traceparent() else trace

    async def settle() -> None:
        await settle_published(store, tenant_id=tenant_id, key=key, created_at=created_at,
                               record=record, slot=slot)

    async def undo() -> None:
        undone = await undo_acceptance(store, tenant_id=tenant_id, key=key,
                                       created_at=created_at, record=record, slot=slot)
        if undone and release is not None:
            await release()

    with telemetry.span(names.INGEST_PRODUCE, attrs, parent=parent) as span:
        header = telemetry.current_traceparent() or trace
        times.add(Stage.API_ACCEPT, time.time() - accepted_at.timestamp())
        entry = Deferred(message_id, record.tier, out_record(record, topic, payload, header,
                                                             binder(rt.settings)),
                         settle, ordered=record.ordering_key is not None)
        with times.timing(Stage.API_KAFKA_ACK):
            outcome = await rt.publisher.publish(entry, undo, deferrable=deferrable)
        if outcome is Outcome.DEFERRED:
            span.set_attribute(names.ATTR_KAFKA_DEFERRED, True)
            return accepted_json(record)
    response = accepted_json(record)
    rt.settler.add(tenant_id, key, response, timed_settle(store, tenant_id=tenant_id, key=key,
                                                          created_at=created_at,
                                                          record=record, slot=slot))
    return response


def timed_settle(store: CassandraStore, *, tenant_id: str, key: str, created_at: datetime,
                 record: IngestRecord, slot: OutboxSlot) -> Callable[[], Awaitable[None]]:
    """:func:`settle_published` for the :class:`~notiflow.gateway.settler.Settler`, its time
    from queued to written recorded as the ``api.settle`` stage."""
    queued = time.monotonic()

    async def settle() -> None:
        await settle_published(store, tenant_id=tenant_id, key=key, created_at=created_at,
                               record=record, slot=slot)
        record_stage(record.tier.value, Stage.API_SETTLE, time.monotonic() - queued)

    return settle


async def settle_published(
    store: CassandraStore, *, tenant_id: str, key: str, created_at: datetime,
    record: IngestRecord, slot: OutboxSlot,
) -> str:
    """Mark a published record's key ``ACCEPTED`` and drop its outbox row; returns the
    ``202`` body. Failures are logged and left to the sweeper (the acceptance stands)."""
    response = accepted_json(record)
    try:
        await store.idempotency.settle_reservation(tenant_id, key, response, slot, created_at)
    except CASSANDRA_DOWN as exc:
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
        if not await store.messages.delete_unsent_message(message_id, tenant_id, accepted_at,
                                                          Status.QUEUED):
            return False
        await store.idempotency.drop_reservation(tenant_id, key)
        await store.idempotency.outbox_remove(slot, created_at, tenant_id, key)
    except CASSANDRA_DOWN as exc:
        log.warning("could not undo acceptance of %s (%s); the outbox sweeper will publish it",
                    message_id, type(exc).__name__)
    return True
