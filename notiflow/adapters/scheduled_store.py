"""Cassandra side of durable scheduling: ``scheduled_work`` rows (written at acceptance,
read and marked released by schedulers, deleted by a cancel) and the schedulers' shard
leases (``scheduler_leases``, one partition per ring, so a scheduler renews every shard it
holds in one conditional batch) and membership (``scheduler_members``: who is alive until when).

A row's ``payload`` (the ingest record: recipient, variables) is encrypted at rest with the
dead letters' key (``NOTIFLOW_DLQ_KEY``, Fernet; rotation as in ``dlq_crypto.py``); a row
that no longer decrypts yields an empty payload, which the send flow dead-letters.

Leases are lightweight transactions (``LOCAL_SERIAL``): two schedulers never both believe
they hold a shard at the same instant of Cassandra's time. A scheduler that loses a lease
while it publishes may publish a row the next owner publishes again (at most once per lost
lease; the send flow's dedup lease absorbs the copy).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from notiflow.adapters.cassandra.session import aio
from notiflow.adapters.cassandra.values import capped_ttl, utc
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.schemas.scheduling import ScheduledRow, bucket_of, shard_of
from notiflow.settings import Settings

_COLUMNS = ("time_bucket, shard, scheduled_at, message_id, topic, payload, tenant_id, tier, "
            "expires_at, traceparent, released_at")
_STATEMENTS = {
    "add": f"INSERT INTO scheduled_work ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
           "null) USING TTL ?",
    "remove": "DELETE FROM scheduled_work WHERE time_bucket = ? AND shard = ? "
              "AND scheduled_at = ? AND message_id = ?",
    "due": f"SELECT {_COLUMNS} FROM scheduled_work WHERE time_bucket = ? AND shard = ? "
           "AND (scheduled_at, message_id) > (?, ?) AND (scheduled_at) <= (?) LIMIT ?",
    "get": f"SELECT {_COLUMNS} FROM scheduled_work WHERE time_bucket = ? AND shard = ? "
           "AND scheduled_at = ? AND message_id = ?",
    "released": "UPDATE scheduled_work USING TTL ? SET released_at = ?, released_by = ? "
                "WHERE time_bucket = ? AND shard = ? AND scheduled_at = ? AND message_id = ?",
    "leases": "SELECT shard, owner, lease_until, watermark FROM scheduler_leases "
              "WHERE ring = ?",
    "lease_new": "INSERT INTO scheduler_leases (ring, shard, owner, lease_until) "
                 "VALUES (?, ?, ?, ?) IF NOT EXISTS",
    "lease_take": "UPDATE scheduler_leases SET owner = ?, lease_until = ? "
                  "WHERE ring = ? AND shard = ? IF lease_until < ?",
    "lease_renew": "UPDATE scheduler_leases SET lease_until = ?, watermark = ? "
                   "WHERE ring = ? AND shard = ? IF owner = ?",
    "members": "SELECT owner, alive_until FROM scheduler_members WHERE ring = ?",
    "member": "INSERT INTO scheduler_members (ring, owner, alive_until) VALUES (?, ?, ?)",
    "member_gone": "DELETE FROM scheduler_members WHERE ring = ? AND owner = ?",
}
log = logging.getLogger(__name__)
EPOCH_MS = datetime(1970, 1, 1, tzinfo=UTC)
RELEASED_KEEP = timedelta(days=1)
"""How long a released row stays readable (for operators) before its TTL removes it."""


@dataclass(frozen=True, slots=True)
class ShardLease:
    """One row of ``scheduler_leases``."""

    shard: int
    owner: str | None
    lease_until: datetime | None
    watermark: datetime | None


def _row(r: dict[str, Any], cipher: DlqCipher) -> ScheduledRow:
    """A stored row; a released row's payload is not decrypted (nobody needs it again)."""
    payload = ""
    if r.get("released_at") is None:
        try:
            payload = cipher.decrypt(r["payload"] or "").decode()
        except (ValueError, UnicodeDecodeError):
            log.error("scheduled row %s: payload does not decrypt with the configured keys",
                      r["message_id"])
    return ScheduledRow(
        time_bucket=utc(r["time_bucket"]) or EPOCH_MS, shard=r["shard"],
        scheduled_at=utc(r["scheduled_at"]) or EPOCH_MS, message_id=r["message_id"],
        topic=r["topic"] or "", payload=payload, tenant_id=r["tenant_id"] or "",
        tier=r["tier"] or "", expires_at=utc(r.get("expires_at")),
        traceparent=r.get("traceparent"), released_at=utc(r.get("released_at")))


class ScheduledStore:
    """Every read and write of scheduled work and scheduler leases."""

    def __init__(self, session: Session, settings: Settings, ring: str = "default",
                 cipher: DlqCipher | None = None) -> None:
        self.session = session
        self.cipher = cipher or DlqCipher.from_settings(settings)
        self.rule = settings.scheduling
        self.ring = ring
        self._stmts: dict[str, PreparedStatement] = {
            name: session.prepare(cql) for name, cql in _STATEMENTS.items()}
        for name in ("lease_new", "lease_take", "lease_renew"):
            self._stmts[name].serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL  # type: ignore[assignment]  # driver stubs type it None
        self._stmts["leases"].consistency_level = ConsistencyLevel.LOCAL_SERIAL  # type: ignore[assignment]

    def _run(self, name: str, params: Sequence[Any]) -> Any:
        return aio(self.session.execute_async(self._stmts[name], params))

    # ------------------------------------------------------------------------- rows

    def place(self, message_id: str, scheduled_at: datetime) -> tuple[datetime, int]:
        """``(time_bucket, shard)`` of a message's row."""
        return (bucket_of(scheduled_at, self.rule.bucket),
                shard_of(message_id, self.rule.shards))

    async def add(self, row: ScheduledRow, now: datetime) -> None:
        """Write a row (idempotent: the same message writes the same cells). It lives until
        its expiry (else its due time) plus :data:`RELEASED_KEEP`, within the TTL Cassandra
        takes (:func:`~notiflow.adapters.cassandra.values.capped_ttl`)."""
        end = row.expires_at or row.scheduled_at
        ttl = capped_ttl(max(60.0, (end - now).total_seconds()
                             + RELEASED_KEEP.total_seconds()), now)
        await self._run("add", (row.time_bucket, row.shard, row.scheduled_at, row.message_id,
                                row.topic, self.cipher.encrypt(row.payload.encode()),
                                row.tenant_id, row.tier,
                                row.expires_at, row.traceparent, ttl))

    async def unschedule(self, message_id: str, scheduled_at: datetime) -> None:
        """Remove a message's row (a cancel); nothing happens when there is none."""
        bucket, shard = self.place(message_id, scheduled_at)
        await self._run("remove", (bucket, shard, scheduled_at.astimezone(UTC), message_id))

    async def get(self, message_id: str, scheduled_at: datetime) -> ScheduledRow | None:
        bucket, shard = self.place(message_id, scheduled_at)
        rows = await self._run("get", (bucket, shard, scheduled_at.astimezone(UTC),
                                       message_id))
        return _row(rows[0], self.cipher) if rows else None

    async def due(self, bucket: datetime, shard: int, after: tuple[datetime, str],
                  until: datetime, limit: int) -> list[ScheduledRow]:
        """Rows of partition (bucket, shard) after clustering position ``after`` and due at
        or before ``until``, in order (released ones included: the caller skips them)."""
        rows = await self._run("due", (bucket, shard, after[0], after[1], until, limit))
        return [_row(r, self.cipher) for r in rows]

    async def mark_released(self, rows: Sequence[ScheduledRow], at: datetime,
                            owner: str) -> None:
        """Record that ``rows`` were published (one unlogged batch per partition)."""
        ttl = int(RELEASED_KEEP.total_seconds())
        by_partition: dict[tuple[datetime, int], list[ScheduledRow]] = {}
        for r in rows:
            by_partition.setdefault((r.time_bucket, r.shard), []).append(r)
        futures = []
        for group in by_partition.values():
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for r in group:
                batch.add(self._stmts["released"], (ttl, at, owner, r.time_bucket, r.shard,
                                                     r.scheduled_at, r.message_id))
            futures.append(aio(self.session.execute_async(batch)))
        for f in futures:
            await f

    # ------------------------------------------------------------------------- leases

    async def leases(self) -> list[ShardLease]:
        rows = await self._run("leases", (self.ring,))
        return [ShardLease(r["shard"], r.get("owner"), utc(r.get("lease_until")),
                           utc(r.get("watermark"))) for r in rows]

    async def claim(self, shard: int, owner: str, until: datetime, now: datetime,
                    exists: bool) -> bool:
        """Take ``shard`` if nobody holds a live lease on it (a lightweight transaction)."""
        if exists:
            rows = await self._run("lease_take", (owner, until, self.ring, shard, now))
        else:
            rows = await self._run("lease_new", (self.ring, shard, owner, until))
        return bool(rows and rows[0].get("[applied]"))

    async def renew(self, owner: str, until: datetime,
                    watermarks: dict[int, datetime | None]) -> bool:
        """Extend every lease in ``watermarks`` to ``until`` and store each shard's
        watermark, all or nothing (one conditional batch): False when ``owner`` lost any."""
        if not watermarks:
            return True
        batch = BatchStatement(batch_type=BatchType.LOGGED,
                               serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL)
        for shard, mark in sorted(watermarks.items()):
            batch.add(self._stmts["lease_renew"], (until, mark, self.ring, shard, owner))
        rows = await aio(self.session.execute_async(batch))
        return bool(rows and rows[0].get("[applied]"))

    async def give_up(self, shards: Sequence[int], owner: str, now: datetime,
                      watermarks: dict[int, datetime | None]) -> None:
        """End ``owner``'s leases on ``shards`` now, keeping their watermarks."""
        for shard in shards:
            await self._run("lease_renew", (now - timedelta(milliseconds=1),
                                            watermarks.get(shard), self.ring, shard, owner))

    async def members(self, now: datetime) -> list[str]:
        """The schedulers known alive at ``now``."""
        rows = await self._run("members", (self.ring,))
        return [r["owner"] for r in rows if (utc(r.get("alive_until")) or EPOCH_MS) > now]

    async def heartbeat(self, owner: str, until: datetime) -> None:
        """``owner`` is alive until ``until`` unless it says so again."""
        await self._run("member", (self.ring, owner, until))

    async def leave(self, owner: str) -> None:
        await self._run("member_gone", (self.ring, owner))
