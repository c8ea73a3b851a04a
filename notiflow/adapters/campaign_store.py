"""Cassandra side of campaigns: ``campaigns`` (one partition per tenant; the request, the
state and the expander's checkpoint), ``campaigns_live`` (the campaigns expanders scan) and
``campaign_errors`` (rejected rows).

Every state change and every checkpoint is a lightweight transaction (``LOCAL_SERIAL``) on
the campaign's row: the API moves the state only from the states it may leave
(:data:`TRANSITIONS`); an expander takes a campaign whose lease has run out and writes its
checkpoint only while it still owns a running campaign, so a paused, cancelled or stolen
campaign is never advanced by a stale expander (it learns the new state from the refusal).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from notiflow.adapters.cassandra.session import aio
from notiflow.adapters.cassandra.values import utc
from notiflow.schemas.campaigns import (
    LIVE_STATES,
    CampaignCounts,
    CampaignRequest,
    CampaignState,
    RowError,
)
from notiflow.schemas.topic_sends import campaign_request
from notiflow.settings import Settings

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LIVE_BUCKET = 0
_COLUMNS = ("tenant_id, campaign_id, name, spec, state, reason, starts_at, ends_at, max_rate, "
            "quota, created_at, updated_at, finished_at, first_expanded_at, manifest_bytes, "
            "header, bytes_read, next_row, rows_read, expanded, rejected, waiting, owner, "
            "lease_until")
_CHECKPOINT = ("bytes_read = ?, next_row = ?, rows_read = ?, expanded = ?, rejected = ?, "
               "waiting = ?, header = ?, manifest_bytes = ?, first_expanded_at = ?, "
               "lease_until = ?, updated_at = ?")
_STATEMENTS = {
    "create": f"INSERT INTO campaigns ({_COLUMNS}) VALUES "
              f"({', '.join('?' * len(_COLUMNS.split(', ')))}) IF NOT EXISTS",
    "live": "INSERT INTO campaigns_live (bucket, tenant_id, campaign_id) VALUES (?, ?, ?)",
    "unlive": "DELETE FROM campaigns_live WHERE bucket = ? AND tenant_id = ? "
              "AND campaign_id = ?",
    "lives": "SELECT tenant_id, campaign_id FROM campaigns_live WHERE bucket = ?",
    "get": f"SELECT {_COLUMNS} FROM campaigns WHERE tenant_id = ? AND campaign_id = ?",
    "of_tenant": f"SELECT {_COLUMNS} FROM campaigns WHERE tenant_id = ? LIMIT ?",
    "state": "UPDATE campaigns SET state = ?, reason = ?, updated_at = ?, finished_at = ? "
             "WHERE tenant_id = ? AND campaign_id = ? IF state IN ?",
    "take": "UPDATE campaigns SET owner = ?, lease_until = ?, state = 'running', "
            "updated_at = ? WHERE tenant_id = ? AND campaign_id = ? "
            "IF lease_until < ? AND state IN ('scheduled', 'running')",
    "checkpoint": f"UPDATE campaigns SET {_CHECKPOINT} WHERE tenant_id = ? "
                  "AND campaign_id = ? IF owner = ? AND state = 'running'",
    "record": f"UPDATE campaigns SET {_CHECKPOINT} WHERE tenant_id = ? "
              "AND campaign_id = ? IF owner = ?",
    "finish": f"UPDATE campaigns SET {_CHECKPOINT}, state = ?, reason = ?, finished_at = ? "
              "WHERE tenant_id = ? AND campaign_id = ? IF owner = ? AND state = 'running'",
    "release": "UPDATE campaigns SET lease_until = ? WHERE tenant_id = ? AND campaign_id = ? "
               "IF owner = ?",
    "error": "INSERT INTO campaign_errors (campaign_id, bucket, row, reason) "
             "VALUES (?, ?, ?, ?)",
    "errors": "SELECT row, reason FROM campaign_errors WHERE campaign_id = ? AND bucket = ? "
              "AND row > ? LIMIT ?",
}
_SERIAL = ("create", "state", "take", "checkpoint", "record", "finish", "release")

TRANSITIONS: dict[CampaignState, tuple[str, ...]] = {
    "paused": ("scheduled", "running"),
    "running": ("paused",),
    "cancelled": (*sorted(LIVE_STATES), "completed"),
}
"""Target state → the states the API may move a campaign from. A completed campaign (every
row expanded) can still be cancelled: its messages not sent yet are."""


@dataclass(frozen=True, slots=True)
class Progress:
    """An expander's checkpoint: where the next row starts and what the rows before it
    became."""

    bytes_read: int = 0
    next_row: int = 1
    rows_read: int = 0
    expanded: int = 0
    rejected: int = 0
    waiting: int = 0
    header: tuple[str, ...] | None = None
    manifest_bytes: int | None = None
    first_expanded_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class CampaignRow:
    """One row of ``campaigns``."""

    tenant_id: str
    campaign_id: str
    name: str
    request: CampaignRequest
    state: CampaignState
    reason: str | None
    starts_at: datetime
    ends_at: datetime
    max_rate: float
    quota: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    progress: Progress
    owner: str | None = None
    lease_until: datetime | None = None

    def counts(self) -> CampaignCounts:
        p = self.progress
        return CampaignCounts(read=p.rows_read, expanded=p.expanded, rejected=p.rejected,
                              waiting=p.waiting)


def _row(r: dict[str, Any]) -> CampaignRow:
    header = r.get("header")
    progress = Progress(
        bytes_read=r.get("bytes_read") or 0, next_row=r.get("next_row") or 1,
        rows_read=r.get("rows_read") or 0, expanded=r.get("expanded") or 0,
        rejected=r.get("rejected") or 0, waiting=r.get("waiting") or 0,
        header=tuple(orjson.loads(header)) if header else None,
        manifest_bytes=r.get("manifest_bytes"),
        first_expanded_at=utc(r.get("first_expanded_at")))
    return CampaignRow(
        tenant_id=r["tenant_id"], campaign_id=r["campaign_id"], name=r["name"] or "",
        request=campaign_request(r["spec"]), state=r["state"],
        reason=r.get("reason"), starts_at=utc(r["starts_at"]) or EPOCH,
        ends_at=utc(r["ends_at"]) or EPOCH, max_rate=r["max_rate"], quota=r["quota"],
        created_at=utc(r["created_at"]) or EPOCH, updated_at=utc(r["updated_at"]) or EPOCH,
        finished_at=utc(r.get("finished_at")), progress=progress, owner=r.get("owner"),
        lease_until=utc(r.get("lease_until")))


def _applied(rows: list[dict[str, Any]]) -> bool:
    return bool(rows and rows[0].get("[applied]"))


class CampaignStore:
    """Every read and write of campaigns."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.error_bucket = settings.campaigns.error_bucket
        self._stmts: dict[str, PreparedStatement] = {
            name: session.prepare(cql) for name, cql in _STATEMENTS.items()}
        for name in _SERIAL:
            self._stmts[name].serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL  # type: ignore[assignment]  # driver stubs type it None
        self._stmts["get"].consistency_level = ConsistencyLevel.LOCAL_SERIAL  # type: ignore[assignment]

    def _run(self, name: str, params: Sequence[Any]) -> Any:
        return aio(self.session.execute_async(self._stmts[name], params))

    async def create(self, row: CampaignRow) -> None:
        """Write a new campaign and index it as live."""
        p = row.progress
        await self._run("create", (
            row.tenant_id, row.campaign_id, row.name, row.request.model_dump_json(),
            row.state, row.reason, row.starts_at, row.ends_at, row.max_rate, row.quota,
            row.created_at, row.updated_at, None, None, p.manifest_bytes, None, 0, 1, 0, 0,
            0, 0, None, EPOCH))
        await self._run("live", (LIVE_BUCKET, row.tenant_id, row.campaign_id))

    async def get(self, tenant_id: str, campaign_id: str) -> CampaignRow | None:
        rows = await self._run("get", (tenant_id, campaign_id))
        return _row(rows[0]) if rows else None

    async def of_tenant(self, tenant_id: str, limit: int = 1000) -> list[CampaignRow]:
        return [_row(r) for r in await self._run("of_tenant", (tenant_id, limit))]

    async def live(self) -> list[tuple[str, str]]:
        """(tenant, campaign) of every campaign not finished."""
        rows = await self._run("lives", (LIVE_BUCKET,))
        return [(r["tenant_id"], r["campaign_id"]) for r in rows]

    async def move(self, row: CampaignRow, state: CampaignState, reason: str | None,
                   now: datetime) -> CampaignRow | None:
        """Move the campaign to ``state`` if it is in one of the states that may lead there
        (:data:`TRANSITIONS`); the updated row, or None when it was not."""
        final = state not in LIVE_STATES
        rows = await self._run("state", (state, reason, now, now if final else None,
                                         row.tenant_id, row.campaign_id,
                                         list(TRANSITIONS[state])))
        if not _applied(rows):
            return None
        if final:
            await self._run("unlive", (LIVE_BUCKET, row.tenant_id, row.campaign_id))
        return replace(row, state=state, reason=reason, updated_at=now,
                       finished_at=now if final else None)

    async def take(self, row: CampaignRow, owner: str, until: datetime,
                   now: datetime) -> bool:
        """Lease a scheduled or running campaign nobody holds (it becomes running)."""
        return _applied(await self._run("take", (owner, until, now, row.tenant_id,
                                                 row.campaign_id, now)))

    def _progress(self, p: Progress, until: datetime, now: datetime) -> tuple[Any, ...]:
        header = orjson.dumps(list(p.header)).decode() if p.header is not None else None
        return (p.bytes_read, p.next_row, p.rows_read, p.expanded, p.rejected, p.waiting,
                header, p.manifest_bytes, p.first_expanded_at, until, now)

    async def checkpoint(self, row: CampaignRow, owner: str, p: Progress, until: datetime,
                         now: datetime) -> bool:
        """Store ``p`` and extend the lease while ``owner`` holds the running campaign;
        False when it no longer does: stop expanding. A campaign paused or cancelled while
        ``owner`` still holds it still gets ``p`` (the rows it covers were written: they are
        expanded messages, and the counts must say so)."""
        values = (*self._progress(p, until, now), row.tenant_id, row.campaign_id, owner)
        rows = await self._run("checkpoint", values)
        if _applied(rows):
            return True
        if rows and rows[0].get("owner") == owner:
            await self._run("record", values)
        return False

    async def finish(self, row: CampaignRow, owner: str, p: Progress,
                     state: CampaignState, reason: str | None, now: datetime) -> bool:
        """Store the last checkpoint and end the campaign (completed or failed)."""
        done = _applied(await self._run("finish", (
            *self._progress(p, now, now), state, reason, now, row.tenant_id,
            row.campaign_id, owner)))
        if done:
            await self._run("unlive", (LIVE_BUCKET, row.tenant_id, row.campaign_id))
        return done

    async def release(self, row: CampaignRow, owner: str, now: datetime) -> None:
        """Let another expander take the campaign at once (a clean stop)."""
        await self._run("release", (now - timedelta(milliseconds=1), row.tenant_id,
                                    row.campaign_id, owner))

    async def unlive(self, row: CampaignRow) -> None:
        await self._run("unlive", (LIVE_BUCKET, row.tenant_id, row.campaign_id))

    async def reject(self, campaign_id: str, errors: Sequence[RowError]) -> None:
        """Record rejected rows (idempotent by row), one unlogged batch per partition."""
        by_bucket: dict[int, list[RowError]] = {}
        for e in errors:
            by_bucket.setdefault(e.row // self.error_bucket, []).append(e)
        futures = []
        for bucket, group in by_bucket.items():
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for e in group:
                batch.add(self._stmts["error"], (campaign_id, bucket, e.row, e.reason))
            futures.append(aio(self.session.execute_async(batch)))
        for f in futures:
            await f

    async def errors(self, campaign_id: str, after: int, limit: int,
                     last_row: int) -> list[RowError]:
        """Rejected rows numbered above ``after`` (up to ``last_row``), in order."""
        out: list[RowError] = []
        bucket = after // self.error_bucket
        while len(out) < limit and bucket <= last_row // self.error_bucket:
            rows = await self._run("errors", (campaign_id, bucket, after, limit - len(out)))
            out.extend(RowError(row=r["row"], reason=r["reason"]) for r in rows)
            bucket += 1
        return out
