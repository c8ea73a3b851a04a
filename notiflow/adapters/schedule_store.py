"""Cassandra side of recurring schedules: ``schedules`` (one partition per tenant) and
``schedules_by_shard`` (which schedules the scheduler leasing a ``scheduled_work`` shard
materialises). The message request (it holds the recipient) is encrypted at rest with the
dead letters' key."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from notiflow.adapters.cassandra.session import aio
from notiflow.adapters.cassandra.values import utc
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.schemas.recurrence import Recurrence
from notiflow.schemas.schedules import ScheduleState
from notiflow.settings import Settings

_COLUMNS = ("tenant_id, schedule_id, kind, expression, timezone, starts_at, ends_at, "
            "channel, tier, template_id, template_version, recipient_masked, request, state, "
            "materialized_until, created_at, updated_at")
_STATEMENTS = {
    "put": f"INSERT INTO schedules ({_COLUMNS}) VALUES "
           "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "get": f"SELECT {_COLUMNS} FROM schedules WHERE tenant_id = ? AND schedule_id = ?",
    "of_tenant": f"SELECT {_COLUMNS} FROM schedules WHERE tenant_id = ? LIMIT ?",
    "state": "UPDATE schedules SET state = ?, updated_at = ?, materialized_until = ? "
             "WHERE tenant_id = ? AND schedule_id = ?",
    "materialized": "UPDATE schedules SET materialized_until = ? "
                    "WHERE tenant_id = ? AND schedule_id = ?",
    "index": "INSERT INTO schedules_by_shard (shard, tenant_id, schedule_id) VALUES (?, ?, ?)",
    "unindex": "DELETE FROM schedules_by_shard WHERE shard = ? AND tenant_id = ? "
               "AND schedule_id = ?",
    "by_shard": "SELECT tenant_id, schedule_id FROM schedules_by_shard WHERE shard = ?",
}


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One row of ``schedules``, ``request`` decrypted (the send request's JSON)."""

    tenant_id: str
    schedule_id: str
    kind: str
    expression: str
    timezone: str
    starts_at: datetime
    ends_at: datetime | None
    channel: str
    tier: str
    template_id: str
    template_version: int
    recipient_masked: str
    request: str
    state: ScheduleState
    materialized_until: datetime | None
    created_at: datetime
    updated_at: datetime

    def recurrence(self) -> Recurrence:
        """The stored schedule as a :class:`Recurrence` (validated when it was created)."""
        return Recurrence("cron" if self.kind == "cron" else "rrule", self.expression,
                          self.timezone, self.starts_at, self.ends_at)


def schedule_shard(schedule_id: str, shards: int) -> int:
    return zlib.crc32(schedule_id.encode()) % shards


class ScheduleStore:
    """Every read and write of recurring schedules."""

    def __init__(self, session: Session, settings: Settings,
                 cipher: DlqCipher | None = None) -> None:
        self.session = session
        self.shards = settings.scheduling.shards
        self.cipher = cipher or DlqCipher.from_settings(settings)
        self._stmts: dict[str, PreparedStatement] = {
            name: session.prepare(cql) for name, cql in _STATEMENTS.items()}

    def _run(self, name: str, params: tuple[Any, ...]) -> Any:
        return aio(self.session.execute_async(self._stmts[name], params))

    def _row(self, r: dict[str, Any]) -> ScheduleRow:
        return ScheduleRow(
            r["tenant_id"], r["schedule_id"], r["kind"], r["expression"], r["timezone"],
            utc(r["starts_at"]) or datetime.min, utc(r.get("ends_at")), r["channel"],
            r["tier"], r["template_id"], r["template_version"], r["recipient_masked"],
            self.cipher.decrypt(r["request"]).decode(), r["state"],
            utc(r.get("materialized_until")), utc(r["created_at"]) or datetime.min,
            utc(r["updated_at"]) or datetime.min)

    async def create(self, row: ScheduleRow) -> None:
        """Write the schedule, then index it under its shard."""
        await self._run("put", (
            row.tenant_id, row.schedule_id, row.kind, row.expression, row.timezone,
            row.starts_at, row.ends_at, row.channel, row.tier, row.template_id,
            row.template_version, row.recipient_masked,
            self.cipher.encrypt(row.request.encode()), row.state, row.materialized_until,
            row.created_at, row.updated_at))
        await self._run("index", (schedule_shard(row.schedule_id, self.shards), row.tenant_id,
                                  row.schedule_id))

    async def get(self, tenant_id: str, schedule_id: str) -> ScheduleRow | None:
        rows = await self._run("get", (tenant_id, schedule_id))
        return self._row(rows[0]) if rows else None

    async def of_tenant(self, tenant_id: str, limit: int = 1000) -> list[ScheduleRow]:
        return [self._row(r) for r in await self._run("of_tenant", (tenant_id, limit))]

    async def set_state(self, row: ScheduleRow, state: ScheduleState, now: datetime,
                        materialized_until: datetime | None) -> None:
        """Change the state (a deleted schedule leaves its shard's index)."""
        await self._run("state", (state, now, materialized_until, row.tenant_id,
                                  row.schedule_id))
        if state == "deleted":
            await self._run("unindex", (schedule_shard(row.schedule_id, self.shards),
                                        row.tenant_id, row.schedule_id))

    async def set_materialized(self, tenant_id: str, schedule_id: str,
                               until: datetime) -> None:
        await self._run("materialized", (until, tenant_id, schedule_id))

    async def in_shard(self, shard: int) -> list[tuple[str, str]]:
        """``(tenant_id, schedule_id)`` of every schedule indexed under ``shard``."""
        return [(r["tenant_id"], r["schedule_id"]) for r in await self._run("by_shard", (shard,))]
