"""Materialising recurring schedules: each occurrence a horizon ahead becomes an accepted
message, exactly as ``POST /v1/messages`` with a ``scheduled_at`` would make it.

Run by the scheduler for the schedules indexed under the shards it leases. Per schedule:
the occurrences after ``materialized_until`` (never older than the tier's TTL: those would
expire unsent) up to now + ``scheduling.horizon``; for each, the message row (``SCHEDULED``)
and its ``scheduled_work`` row (or, due within ``min_lead``, its ingest record straight to
Kafka); then ``materialized_until`` moves on. A message's id derives from (schedule,
instant), so a crash before ``materialized_until`` moved, or two schedulers during a lease
handover, write the same message again, never a second one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

from notiflow.adapters.cassandra.values import to_ms
from notiflow.adapters.envelope import dump, envelope
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.schedule_store import ScheduleRow
from notiflow.correlation import CorrelationKeys
from notiflow.flows.common.steps import snapshot_of
from notiflow.ingest_binding import binder
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import IngestRecord, MessageSnapshot, SendRequest
from notiflow.schemas.recurrence import occurrences
from notiflow.schemas.schedules import occurrence_message_id
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import Settings

log = logging.getLogger("notiflow.flows.recurring")


class Schedules(Protocol):
    async def in_shard(self, shard: int) -> list[tuple[str, str]]: ...

    async def get(self, tenant_id: str, schedule_id: str) -> ScheduleRow | None: ...

    async def set_materialized(self, tenant_id: str, schedule_id: str,
                               until: datetime) -> None: ...


class MessageRows(Protocol):
    async def create_message(self, message_id: str, snap: MessageSnapshot, status: Status,
                             now: datetime) -> bool: ...


class Rows(Protocol):
    async def add(self, row: ScheduledRow, now: datetime) -> None: ...


Publish = Callable[[Sequence[OutRecord]], Awaitable[None]]


def occurrence_record(settings: Settings, keys: CorrelationKeys, row: ScheduleRow,
                      req: SendRequest, at: datetime, now: datetime) -> IngestRecord:
    """The ingest record of the occurrence at ``at`` of ``row``'s request ``req``, accepted
    ``now``; its message id keyed by ``keys``."""
    data = req.model_dump()
    at = to_ms(at)
    data.update(tenant_id=row.tenant_id,
                message_id=occurrence_message_id(keys, row.schedule_id, at),
                accepted_at=to_ms(now), scheduled_at=at,
                expires_at=at + settings.tier_ttl(req.tier),
                idempotency_key=f"{row.schedule_id}:{int(at.timestamp() * 1000)}")
    return IngestRecord.model_validate(data)


class Materializer:
    """Turns the due-soon occurrences of the schedules in some shards into messages."""

    def __init__(self, settings: Settings, schedules: Schedules, messages: MessageRows,
                 rows: Rows, publish: Publish, clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.keys = CorrelationKeys.from_settings(settings)
        self.rule = settings.scheduling
        self.schedules = schedules
        self.messages = messages
        self.rows = rows
        self.publish = publish
        self.clock = clock

    async def tick(self, shards: Iterable[int]) -> int:
        """Materialise every active schedule of ``shards``; returns the messages made."""
        made = 0
        for shard in shards:
            for tenant_id, schedule_id in await self.schedules.in_shard(shard):
                row = await self.schedules.get(tenant_id, schedule_id)
                if row is not None and row.state == "active":
                    made += await self.materialize(row)
        return made

    async def materialize(self, row: ScheduleRow) -> int:
        now = self.clock()
        until = now + self.rule.horizon
        oldest = now - self.settings.tier_ttl(Tier(row.tier))
        after = max(row.materialized_until or row.starts_at - timedelta(milliseconds=1),
                    oldest)
        times = occurrences(row.recurrence(), after, until, limit=self.rule.page)
        req = SendRequest.model_validate_json(row.request) if times else None
        for at in times:
            assert req is not None
            await self.accept(row, req, at, now)
        done = times[-1] if len(times) == self.rule.page else until
        await self.schedules.set_materialized(row.tenant_id, row.schedule_id, done)
        if times:
            log.info("schedule %s: %d occurrence(s) up to %s accepted", row.schedule_id,
                     len(times), times[-1].isoformat())
        return len(times)

    async def accept(self, row: ScheduleRow, req: SendRequest, at: datetime,
                     now: datetime) -> None:
        """Durable acceptance of one occurrence (idempotent)."""
        record = occurrence_record(self.settings, self.keys, row, req, at, now)
        assert record.message_id is not None and record.scheduled_at is not None
        mid, due = record.message_id, record.scheduled_at
        payload = dump(record, envelope(self.settings))
        topic = self.settings.ingest_topic(record.channel, record.tier)
        await self.messages.create_message(mid, snapshot_of(record), Status.SCHEDULED, now)
        if due - now >= self.rule.min_lead:
            await self.rows.add(ScheduledRow.waiting(record, due, topic, payload,
                                                     self.rule.bucket, self.rule.shards), now)
        else:
            value = payload.encode()
            await self.publish([OutRecord(topic, record.partition_key(), value, binder(
                self.settings).sign(make_headers(mid, record.tenant_id, record.tier.value),
                                    record.channel.value, record.tier.value, value))])
