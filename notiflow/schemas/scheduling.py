"""Where scheduled work waits: the ``scheduled_work`` layout (docs/design.md, "Scheduling").
Pure functions shared by the API (writer), the scheduler (reader) and cancellation (remover),
so all three agree on a row's partition."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from notiflow.schemas.messages import IngestRecord

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def bucket_of(at: datetime, width: timedelta) -> datetime:
    """The start of the bucket holding ``at`` (UTC, a multiple of ``width`` since 1970)."""
    step = int(width.total_seconds() * 1000)
    ms = int((at.astimezone(UTC) - EPOCH).total_seconds() * 1000)
    return EPOCH + timedelta(milliseconds=ms - ms % step)


def shard_of(message_id: str, shards: int) -> int:
    """The shard of a message's row (stable across processes and releases)."""
    return zlib.crc32(message_id.encode()) % shards


def fair_share(shards: int, members: int) -> int:
    """Shards one of ``members`` live schedulers should hold."""
    return math.ceil(shards / max(1, members))


@dataclass(frozen=True, slots=True)
class ScheduledRow:
    """One message waiting in ``scheduled_work``: the ingest record as the API accepted it
    (``payload``, for ``topic``), its partition, and what the scheduler re-checks."""

    time_bucket: datetime
    shard: int
    scheduled_at: datetime
    message_id: str
    topic: str
    payload: str
    tenant_id: str
    tier: str
    expires_at: datetime | None = None
    traceparent: str | None = None
    released_at: datetime | None = None

    @classmethod
    def waiting(cls, record: IngestRecord, due: datetime, topic: str, payload: str,
                bucket: timedelta, shards: int, traceparent: str | None = None
                ) -> ScheduledRow:
        """The row of ``record`` (serialised as ``payload``) due at ``due``, placed in its
        bucket of width ``bucket`` and its shard of ``shards``."""
        mid = record.message_id or ""
        return cls(bucket_of(due, bucket), shard_of(mid, shards), due, mid, topic, payload,
                   record.tenant_id, record.tier.value, record.expires_at, traceparent)

    @property
    def position(self) -> tuple[datetime, str]:
        """Clustering position within the partition."""
        return self.scheduled_at, self.message_id
