"""Items that travel between the steps of the dataflows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from notiflow.redact import recipient_hash
from notiflow.schemas.messages import DlqRecord, IngestRecord, Receipt, StatusEvent


@dataclass(frozen=True, slots=True)
class SourceRef:
    """Where a record came from: enough to find it again in Kafka."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourceRef, (self.topic, self.partition, self.offset, self.timestamp_ms))


@dataclass(frozen=True, slots=True)
class Work:
    """An ingest record ready for the send path (message_id and accepted_at filled in)."""

    record: IngestRecord
    source: SourceRef
    raw: bytes
    key: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    seen_at: float = 0.0
    """When the send flow parsed the record (epoch seconds): where the latency budget's
    ``kafka`` stage ends and its ``flow`` stage begins."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled positionally: Bytewax snapshots every pending ``Work`` at each epoch, and
        the dataclass default (``_dataclass_getstate``, a ``fields()`` walk per object) was
        7 % of the send flow's CPU in ``notiflow bench throughput``."""
        return (Work, (self.record, self.source, self.raw, self.key, self.headers,
                       self.seen_at))

    @property
    def message_id(self) -> str:
        assert self.record.message_id is not None
        return self.record.message_id

    @property
    def accepted_at(self) -> datetime:
        assert self.record.accepted_at is not None
        return self.record.accepted_at

    @property
    def recipient_hash(self) -> str:
        return recipient_hash(self.record.tenant_id, self.record.recipient_key())

    @property
    def due_at(self) -> datetime | None:
        """When the message may be attempted (retry backoff or schedule); None = now."""
        times = [t for t in (self.record.not_before, self.record.scheduled_at) if t is not None]
        return max(times) if times else None

    def is_due(self, now: datetime) -> bool:
        due = self.due_at
        return due is None or due <= now


@dataclass(frozen=True, slots=True)
class Retry:
    """The next attempt of a message, to be produced back to its ingest topic."""

    work: Work
    record: IngestRecord


Out = StatusEvent | DlqRecord | Retry | Receipt
"""What the send flow emits (encoded to Kafka records by the sink step)."""

@dataclass(frozen=True, slots=True)
class SourcedReceipt:
    """A receipt with where it came from (for a DLQ record if it cannot be correlated)."""

    receipt: Receipt
    source: SourceRef
    raw: bytes


ReconcileIn = StatusEvent | SourcedReceipt


def utcnow() -> datetime:
    return datetime.now(UTC)
