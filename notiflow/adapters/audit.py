"""The audit trail in Cassandra (``audit_log``, ``audit_digests``; dead-letter actions in
``dlq_audit``). Rows are only ever inserted; the one conditional write is the swap of a
configuration digest, so that of several processes starting with a changed configuration
exactly one records the change."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
from cassandra.cluster import Session
from cassandra.util import uuid_from_time

from notiflow.adapters.cassandra.session import aio
from notiflow.adapters.cassandra.values import utc
from notiflow.audit import AuditEvent

DLQ_TIERS = ("P0", "P1", "P2", "P3", "reconcile", "webhooks")
"""The partitions of ``dlq_audit`` (``adapters/dlq/ledger.py`` ``AuditRow.tier``)."""

_CQL: dict[str, str] = {
    "append": "INSERT INTO audit_log (day, at, event_id, action, actor, tenant_id, subject, "
    "detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    "day": "SELECT at, action, actor, tenant_id, subject, detail FROM audit_log WHERE day = ?",
    "dlq_day": "SELECT at, dlq_id, action, actor, reason, message_id, detail FROM dlq_audit "
    "WHERE tier = ? AND day = ?",
    "digest": "SELECT digest, detail FROM audit_digests WHERE subject = ?",
    "first_digest": "INSERT INTO audit_digests (subject, digest, detail, at) "
    "VALUES (?, ?, ?, ?) IF NOT EXISTS",
    "swap_digest": "UPDATE audit_digests SET digest = ?, detail = ?, at = ? WHERE subject = ? "
    "IF digest = ?",
}


class AuditLog:
    def __init__(self, session: Session) -> None:
        self.session = session
        self._stmts = {name: session.prepare(cql) for name, cql in _CQL.items()}

    async def _run(self, name: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        return await aio(self.session.execute_async(self._stmts[name], params))

    async def append(self, event: AuditEvent) -> None:
        at = event.at.astimezone(UTC)
        await self._run("append", (at.date(), at, uuid_from_time(at), event.action,
                                   event.actor, event.tenant_id, event.subject,
                                   orjson.dumps(event.detail).decode()))

    async def digest(self, subject: str) -> tuple[str, dict[str, Any]] | None:
        rows = await self._run("digest", (subject,))
        if not rows or rows[0]["digest"] is None:
            return None
        return rows[0]["digest"], orjson.loads(rows[0]["detail"] or "{}")

    async def swap_digest(self, subject: str, before: str | None, after: str,
                          detail: dict[str, Any], at: datetime) -> bool:
        """Record ``after`` as the subject's digest if it still is ``before``; whether this
        call made the change."""
        text = orjson.dumps(detail).decode()
        if before is None:
            rows = await self._run("first_digest", (subject, after, text, at))
        else:
            rows = await self._run("swap_digest", (after, text, at, subject, before))
        return bool(rows and rows[0].get("[applied]"))

    async def read(self, since: datetime, until: datetime) -> list[AuditEvent]:
        """Every event from ``since`` to ``until``, dead-letter actions included, newest
        first."""
        events: list[AuditEvent] = []
        for day in _days(since, until):
            for row in await self._run("day", (day,)):
                events.append(AuditEvent(
                    at=utc(row["at"]) or since, action=row["action"], actor=row["actor"] or "",
                    tenant_id=row["tenant_id"], subject=row["subject"] or "",
                    detail=orjson.loads(row["detail"] or "{}")))
            for tier in DLQ_TIERS:
                for row in await self._run("dlq_day", (tier, day)):
                    events.append(AuditEvent(
                        at=utc(row["at"]) or since, action=f"dlq.{row['action']}",
                        actor=row["actor"] or "", tenant_id=None,
                        subject=f"dlq:{tier}:{row['dlq_id']}",
                        detail={"reason": row["reason"], "message_id": row["message_id"],
                                **orjson.loads(row["detail"] or "{}")}))
        return sorted((e for e in events if since <= e.at <= until),
                      key=lambda e: e.at, reverse=True)


def _days(since: datetime, until: datetime) -> Iterable[date]:
    day = since.astimezone(UTC).date()
    while day <= until.astimezone(UTC).date():
        yield day
        day += timedelta(days=1)
