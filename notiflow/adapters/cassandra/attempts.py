"""Delivery attempts, the provider message index (which attempt a provider's message id
belongs to), receipt deduplication, and their ``provider_outcomes_by_hour`` rows
(``ops/queries.md``)."""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime

from notiflow.adapters.cassandra.session import Row, Statements, Write
from notiflow.adapters.cassandra.values import from_row, hour_of, operator_shard, to_ms, ts, utc
from notiflow.adapters.rows import AttemptRow
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import AttemptRecord


def attempt_row(row: Row) -> AttemptRow:
    """An ``attempts`` row as an :class:`AttemptRow`."""
    return from_row(AttemptRow, row, attempt_no=int, started_at=utc, completed_at=utc)


@dataclass(frozen=True, slots=True)
class ProviderIndexRow:
    """The attempt a provider's message id was recorded for, and the send's trace."""

    provider_id: str
    provider_message_id: str
    message_id: str
    attempt_no: int | None = None
    traceparent: str | None = None

    @classmethod
    def of(cls, row: Row) -> ProviderIndexRow:
        return from_row(cls, row, attempt_no=lambda a: int(a) if a is not None else None)


@dataclass(frozen=True, slots=True)
class ReceiptRecord:
    """A receipt id already recorded (``receipts_dedup``): when it was first received."""

    received_at: datetime | None

    @classmethod
    def of(cls, row: Row) -> ReceiptRecord:
        return cls(utc(row.get("received_at")))


class AttemptStore:
    """Attempt rows, the provider message index and receipts already applied."""

    def __init__(self, cql: Statements) -> None:
        self.cql = cql
        cql.prepare(STATEMENTS)
        cql.prepare(OPERATOR_STATEMENTS, optional=True)
        cql.keyed("receipt_get", "provider_event_id", "provider_event_id, ")
        cql.keyed("provider_index_get", "provider_message_id")

    async def record_attempt(self, message_id: str, a: AttemptRecord,
                             traceparent: str | None = None) -> None:
        await self.cql.write_all(self.attempt_writes(message_id, a, traceparent))

    def attempt_writes(self, message_id: str, a: AttemptRecord,
                       traceparent: str | None = None) -> list[Write]:
        """The attempt row, its ``provider_outcomes_by_hour`` row (at ``completed_at``) and
        the provider message index (with the send's ``traceparent``, for receipts that do not
        echo it); all upserts keyed by the attempt (replay-safe)."""
        writes: list[Write] = [("attempt_insert", (
            message_id, a.attempt_no, a.provider_id, a.provider_message_id, a.outcome,
            a.normalized_error, a.error_code, ts(a.started_at), ts(a.completed_at),
        ))]
        if self.cql.has("outcome_insert"):
            latency = round((a.completed_at - a.started_at).total_seconds() * 1000)
            at = to_ms(a.completed_at)
            writes.append(("outcome_insert", (
                a.provider_id, hour_of(at), operator_shard(message_id), at, message_id,
                f"attempt:{a.attempt_no}", "attempt", a.outcome, a.normalized_error,
                a.error_code, max(0, latency), a.provider_message_id,
            )))
        if a.provider_message_id:
            key = (a.provider_id, a.provider_message_id, message_id, a.attempt_no)
            if traceparent and self.cql.has("provider_index_insert_traced"):
                writes.append(("provider_index_insert_traced", (*key, traceparent)))
            else:
                writes.append(("provider_index_insert", key))
        return writes

    async def attempts(self, message_id: str) -> list[AttemptRow]:
        """A message's attempts, in attempt order."""
        return [attempt_row(r) for r in await self.cql.run("attempts_get", (message_id,))]

    async def message_for_provider_id(
        self, provider_id: str, provider_message_id: str
    ) -> ProviderIndexRow | None:
        """The provider message index row of a provider's message id, None when unknown."""
        row = await self.cql.read("provider_index_get", (provider_id,), provider_message_id)
        return ProviderIndexRow.of(row) if row else None

    async def receipt_record(self, provider_id: str,
                             provider_event_id: str) -> ReceiptRecord | None:
        """The ``receipts_dedup`` row of a receipt id, None when it is new."""
        row = await self.cql.read("receipt_get", (provider_id,), provider_event_id)
        return ReceiptRecord.of(row) if row else None

    def receipt_records(self, keys: Sequence[tuple[str, str]]
                        ) -> Awaitable[list[ReceiptRecord | None]]:
        """:meth:`receipt_record` of each ``(provider_id, provider_event_id)``, in order."""
        return _records(self.cql.read_each("receipt_get", [((p,), e) for p, e in keys]))

    def receipt_writes(
        self, provider_id: str, provider_event_id: str, message_id: str, status: Status,
        now: datetime, seen: ReceiptRecord | None,
    ) -> list[Write]:
        """A new receipt id is recorded; either way the receipt's
        ``provider_outcomes_by_hour`` row is (re)written at its first ``received_at``, so a
        replay after a crash between the writes completes it. A read, then plain writes (no
        Paxos round): two copies of one receipt processed at the same instant are both
        taken as new, and every write they cause is keyed by the receipt, so the second
        rewrites the first's rows."""
        received = seen.received_at if seen is not None else to_ms(now)
        writes: list[Write] = []
        if seen is None:
            writes.append(("receipt_put", (provider_id, provider_event_id, message_id,
                                           status.value, received)))
        if self.cql.has("outcome_insert") and received is not None:
            writes.append(("outcome_insert", (
                provider_id, hour_of(received), operator_shard(message_id), received,
                message_id, f"receipt:{provider_event_id}", "receipt", status.value, None, None,
                None, None,
            )))
        return writes


async def _records(rows: Awaitable[list[Row | None]]) -> list[ReceiptRecord | None]:
    return [ReceiptRecord.of(r) if r else None for r in await rows]


STATEMENTS: dict[str, str] = {
    "attempt_insert": "INSERT INTO attempts (message_id, attempt_no, provider_id, "
    "provider_message_id, outcome, normalized_error, error_code, started_at, completed_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "attempts_get": "SELECT * FROM attempts WHERE message_id = ?",
    "provider_index_insert": "INSERT INTO provider_messages (provider_id, provider_message_id, "
    "message_id, attempt_no) VALUES (?, ?, ?, ?)",
    "provider_index_get": "SELECT * FROM provider_messages WHERE provider_id = ? "
    "AND provider_message_id = ?",
    "receipt_get": "SELECT received_at FROM receipts_dedup WHERE provider_id = ? "
    "AND provider_event_id = ?",
    "receipt_put": "INSERT INTO receipts_dedup (provider_id, provider_event_id, message_id, "
    "status, received_at) VALUES (?, ?, ?, ?, ?)",
}

OPERATOR_STATEMENTS: dict[str, str] = {
    "outcome_insert": "INSERT INTO provider_outcomes_by_hour (provider_id, hour, shard, at, "
    "message_id, ref, kind, outcome, normalized_error, error_code, latency_ms, "
    "provider_message_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "provider_index_insert_traced": "INSERT INTO provider_messages (provider_id, "
    "provider_message_id, message_id, attempt_no, traceparent) VALUES (?, ?, ?, ?, ?)",
}
"""Migration 0004's table and 0005's trace column; prepared separately so a store started
before those migrations still works (it skips these writes and logs an error)."""
