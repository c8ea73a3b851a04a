"""Campaign state webhooks in Cassandra (``campaign_notices``, one partition: campaigns change
state a handful of times each): written when a state changes, claimed by an expander with a
lightweight transaction on ``next_at`` before each attempt (two expanders never POST the same
attempt), rescheduled on failure, deleted once delivered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from cassandra import ConsistencyLevel
from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from notiflow.adapters.campaign_store import CampaignRow
from notiflow.adapters.cassandra.session import aio
from notiflow.adapters.cassandra.values import utc
from notiflow.schemas.campaigns import CampaignCounts

BUCKET = 0
EVENT_TYPE = "campaign.state"
_STATEMENTS = {
    "add": "INSERT INTO campaign_notices (bucket, webhook_id, campaign_id, tenant_id, url, "
           "body, attempt, next_at, created_at) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?) "
           "IF NOT EXISTS",
    "pending": "SELECT webhook_id, campaign_id, tenant_id, url, body, attempt, next_at, "
               "gave_up_at FROM campaign_notices WHERE bucket = ?",
    "claim": "UPDATE campaign_notices SET next_at = ? WHERE bucket = ? AND webhook_id = ? "
             "IF next_at = ?",
    "retry": "UPDATE campaign_notices SET attempt = ?, next_at = ?, last_error = ? "
             "WHERE bucket = ? AND webhook_id = ?",
    "gave_up": "UPDATE campaign_notices SET attempt = ?, gave_up_at = ?, last_error = ? "
               "WHERE bucket = ? AND webhook_id = ?",
    "done": "DELETE FROM campaign_notices WHERE bucket = ? AND webhook_id = ?",
}


@dataclass(frozen=True, slots=True)
class Notice:
    """One state change to announce."""

    webhook_id: str
    campaign_id: str
    tenant_id: str
    url: str
    body: bytes
    attempt: int
    next_at: datetime
    gave_up_at: datetime | None = None


def notice_of(row: CampaignRow, counts: CampaignCounts, at: datetime) -> Notice | None:
    """The notice of ``row``'s current state (None when the campaign names no webhook);
    its id is stable for this change (campaign, state, instant)."""
    url = row.request.webhook
    if url is None:
        return None
    ms = int(at.timestamp() * 1000)
    data = {"campaign_id": row.campaign_id, "tenant_id": row.tenant_id, "name": row.name,
            "state": row.state, "reason": row.reason, "counts": counts.model_dump(),
            "occurred_at": at.astimezone(UTC)}
    body = orjson.dumps({"type": EVENT_TYPE, "timestamp": at.astimezone(UTC), "data": data},
                        option=orjson.OPT_UTC_Z)
    return Notice(f"{row.campaign_id}_{row.state}_{ms}", row.campaign_id, row.tenant_id,
                  str(url), body, 0, at)


def _notice(r: dict[str, Any]) -> Notice:
    return Notice(r["webhook_id"], r["campaign_id"], r["tenant_id"], r["url"],
                  (r["body"] or "").encode(), r["attempt"] or 0,
                  utc(r["next_at"]) or datetime.fromtimestamp(0, UTC),
                  utc(r.get("gave_up_at")))


class NoticeStore:
    """Every read and write of campaign notices."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._stmts: dict[str, PreparedStatement] = {
            name: session.prepare(cql) for name, cql in _STATEMENTS.items()}
        for name in ("add", "claim"):
            self._stmts[name].serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL  # type: ignore[assignment]  # driver stubs type it None

    def _run(self, name: str, params: Sequence[Any]) -> Any:
        return aio(self.session.execute_async(self._stmts[name], params))

    async def add(self, n: Notice) -> None:
        await self._run("add", (BUCKET, n.webhook_id, n.campaign_id, n.tenant_id, n.url,
                                n.body.decode(), n.next_at, n.next_at))

    async def due(self, now: datetime) -> list[Notice]:
        """Notices due at ``now`` that have not been given up."""
        rows = await self._run("pending", (BUCKET,))
        due = [n for n in map(_notice, rows) if n.gave_up_at is None and n.next_at <= now]
        return sorted(due, key=lambda n: n.next_at)

    async def claim(self, n: Notice, until: datetime) -> bool:
        """Take this attempt of ``n`` (its ``next_at`` moves to ``until``): False when
        another expander took it first."""
        rows = await self._run("claim", (until, BUCKET, n.webhook_id, n.next_at))
        return bool(rows and rows[0].get("[applied]"))

    async def retry(self, n: Notice, attempt: int, at: datetime, error: str) -> None:
        await self._run("retry", (attempt, at, error, BUCKET, n.webhook_id))

    async def give_up(self, n: Notice, attempt: int, at: datetime, error: str) -> None:
        await self._run("gave_up", (attempt, at, error, BUCKET, n.webhook_id))

    async def done(self, n: Notice) -> None:
        await self._run("done", (BUCKET, n.webhook_id))
