"""Idempotency reservations and the outbox of acceptances not yet published.

A reservation row (``idempotency``) holds a tenant's ``Idempotency-Key``: ``PENDING`` with
the record to publish, then ``ACCEPTED`` with the response. Its outbox row
(``outbox_buckets``, 10-second buckets by shard) tells the sweeper which reservations may
still be pending; ``outbox_pending`` is the legacy table it drains.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from notiflow.adapters.cassandra.session import Row, Statements, Write
from notiflow.adapters.cassandra.values import from_row, utc
from notiflow.settings import Settings

OUTBOX_SHARDS = 16
OUTBOX_BUCKET_MS = 10_000
"""Width of an ``outbox_buckets`` time bucket."""
OUTBOX_READ_LIMIT = 500


@dataclass(frozen=True, slots=True)
class ReservationRow:
    """An ``idempotency`` row: ``state`` ``PENDING`` with the record to publish (``topic``,
    ``payload``), then ``ACCEPTED`` with ``response``; ``created_at`` in UTC."""

    tenant_id: str
    idempotency_key: str
    request_hash: str | None = None
    message_id: str | None = None
    state: str | None = None
    topic: str | None = None
    payload: str | None = None
    response: str | None = None
    created_at: datetime | None = None

    @classmethod
    def of(cls, row: Row) -> ReservationRow:
        return from_row(cls, row, created_at=utc)


@dataclass(frozen=True)
class Reservation:
    """Outcome of reserving an idempotency key (a lightweight transaction): ``existing``,
    the row that was there, when the transaction returned it."""

    applied: bool
    existing: ReservationRow | None


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """An outbox row: the reservation of ``(tenant_id, idempotency_key)``, written at
    ``created_at`` (UTC)."""

    created_at: datetime
    tenant_id: str
    idempotency_key: str

    @classmethod
    def of(cls, row: Row) -> OutboxRow:
        return from_row(cls, row, created_at=utc)


@dataclass(frozen=True, slots=True)
class OutboxSlot:
    """Where an outbox row lives: its 10-second ``bucket`` (of when it was written) and its
    ``shard``; ``bucket`` None names the legacy ``outbox_pending`` table."""

    bucket: int | None
    shard: int

    @staticmethod
    def bucket_of(at: datetime) -> int:
        return int(at.timestamp() * 1000) // OUTBOX_BUCKET_MS


class IdempotencyStore:
    """Reservations of idempotency keys and their outbox rows."""

    def __init__(self, cql: Statements, settings: Settings) -> None:
        self.cql = cql
        ttl = int(settings.idempotency_ttl.total_seconds())
        cql.prepare(STATEMENTS)
        cql.prepare({
            "reserve": "INSERT INTO idempotency (tenant_id, idempotency_key, request_hash, "
            "message_id, state, topic, payload, created_at) "
            f"VALUES (?, ?, ?, ?, 'PENDING', ?, ?, ?) IF NOT EXISTS USING TTL {ttl}",
            "reservation_put": "INSERT INTO idempotency (tenant_id, idempotency_key, "
            "request_hash, message_id, state, topic, payload, created_at) "
            f"VALUES (?, ?, ?, ?, 'PENDING', ?, ?, ?) USING TTL {ttl}",
            "idem_accept": f"UPDATE idempotency USING TTL {ttl} SET state = 'ACCEPTED', "
            "response = ? WHERE tenant_id = ? AND idempotency_key = ?",
        })
        cql.keyed("idem_get", "idempotency_key")

    async def reserve(
        self, tenant_id: str, key: str, request_hash: str, message_id: str, topic: str,
        payload: str, created_at: datetime,
    ) -> Reservation:
        rows = await self.cql.run(
            "reserve", (tenant_id, key, request_hash, message_id, topic, payload, created_at)
        )
        row = rows[0] if rows else {"[applied]": False}
        if row.get("[applied]"):
            return Reservation(True, None)
        return Reservation(False, ReservationRow.of(row) if row.get("tenant_id") else None)

    @staticmethod
    def reservation_write(tenant_id: str, key: str, request_hash: str, message_id: str,
                          topic: str, payload: str, created_at: datetime) -> Write:
        """The ``PENDING`` reservation of :meth:`reserve`, written plainly (no Paxos round),
        for ``write_all``: for a key whose requests something else serialises (an
        idempotency fence, or a key nobody else can know)."""
        return ("reservation_put",
                (tenant_id, key, request_hash, message_id, topic, payload, created_at))

    async def get_reservation(self, tenant_id: str, key: str) -> ReservationRow | None:
        """The key's reservation row (``IN`` reads of concurrent callers when coalescing)."""
        row = await self.cql.read("idem_get", (tenant_id,), key)
        return ReservationRow.of(row) if row else None

    async def settle_reservation(self, tenant_id: str, key: str, response: str,
                                 slot: OutboxSlot, created_at: datetime) -> None:
        """Mark the key ``ACCEPTED`` and drop its outbox row, in one request."""
        await self.cql.write_all([("idem_accept", (response, tenant_id, key)),
                                  outbox_remove_write(slot, created_at, tenant_id, key)])

    async def drop_reservation(self, tenant_id: str, key: str) -> None:
        await self.cql.run("idem_delete", (tenant_id, key))

    async def outbox_add(self, slot: OutboxSlot, created_at: datetime, tenant_id: str,
                         key: str) -> None:
        await self.cql.write_all([self.outbox_write(slot, created_at, tenant_id, key)])

    @staticmethod
    def outbox_write(slot: OutboxSlot, created_at: datetime, tenant_id: str, key: str) -> Write:
        """The outbox row of :meth:`outbox_add` (for ``write_all``)."""
        return ("outbox_add", (slot.bucket, slot.shard, created_at, tenant_id, key))

    async def outbox_remove(self, slot: OutboxSlot, created_at: datetime, tenant_id: str,
                            key: str) -> None:
        await self.cql.write_all([outbox_remove_write(slot, created_at, tenant_id, key)])

    async def outbox_rows(self, slot: OutboxSlot) -> list[OutboxRow]:
        """Up to :data:`OUTBOX_READ_LIMIT` outbox rows of one bucket and shard, oldest first
        (``slot.bucket`` None: the legacy ``outbox_pending`` shard)."""
        if slot.bucket is None:
            rows = await self.cql.run("outbox_legacy_rows", (slot.shard,))
        else:
            rows = await self.cql.run("outbox_rows", (slot.bucket, slot.shard))
        return [OutboxRow.of(r) for r in rows]

    async def outbox_cursor(self, shard: int, start: int) -> int:
        """The first bucket of ``shard`` that may still hold rows; ``start`` when the shard
        has no cursor yet (the first sweeper to ask sets it)."""
        row = await self.cql.first("outbox_cursor_init", (shard, start)) or {}
        bucket = row.get("bucket")
        if row.get("[applied]", True) or bucket is None:
            return start
        return int(bucket)

    async def outbox_advance(self, shard: int, bucket: int) -> None:
        """Move ``shard``'s cursor to ``bucket`` (the buckets before it are empty)."""
        await self.cql.run("outbox_cursor_set", (bucket, shard))

    async def outbox_park(self, slot: OutboxSlot, created_at: datetime, tenant_id: str,
                          key: str, reason: str, now: datetime) -> None:
        """Move an outbox row that cannot be published to ``outbox_parked``."""
        await self.cql.write_all([
            ("outbox_park", (tenant_id, key, created_at, reason, now)),
            outbox_remove_write(slot, created_at, tenant_id, key)])


def outbox_remove_write(slot: OutboxSlot, created_at: datetime, tenant_id: str,
                        key: str) -> Write:
    """The deletion of an outbox row (for ``write_all``)."""
    if slot.bucket is None:
        return ("outbox_legacy_remove", (slot.shard, created_at, tenant_id, key))
    return ("outbox_remove", (slot.bucket, slot.shard, created_at, tenant_id, key))


STATEMENTS: dict[str, str] = {
    "idem_get": "SELECT * FROM idempotency WHERE tenant_id = ? AND idempotency_key = ?",
    "idem_delete": "DELETE FROM idempotency WHERE tenant_id = ? AND idempotency_key = ?",
    "outbox_add": "INSERT INTO outbox_buckets (bucket, shard, created_at, tenant_id, "
    "idempotency_key) VALUES (?, ?, ?, ?, ?)",
    "outbox_remove": "DELETE FROM outbox_buckets WHERE bucket = ? AND shard = ? AND "
    "created_at = ? AND tenant_id = ? AND idempotency_key = ?",
    "outbox_rows": "SELECT * FROM outbox_buckets WHERE bucket = ? AND shard = ? "
    f"LIMIT {OUTBOX_READ_LIMIT}",
    "outbox_legacy_remove": "DELETE FROM outbox_pending WHERE shard = ? AND created_at = ? "
    "AND tenant_id = ? AND idempotency_key = ?",
    "outbox_legacy_rows": f"SELECT * FROM outbox_pending WHERE shard = ? LIMIT {OUTBOX_READ_LIMIT}",
    "outbox_cursor_init": "INSERT INTO outbox_cursor (shard, bucket) VALUES (?, ?) IF NOT EXISTS",
    "outbox_cursor_set": "UPDATE outbox_cursor SET bucket = ? WHERE shard = ?",
    "outbox_park": "INSERT INTO outbox_parked (tenant_id, idempotency_key, created_at, reason, "
    "parked_at) VALUES (?, ?, ?, ?, ?)",
}
