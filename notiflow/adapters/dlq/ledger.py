"""What operators did to dead letters, kept in Cassandra: the resolved set, the audit trail,
and the reopening of the message a replayed dead letter belongs to.

Contracts:

- A dead letter an operator replayed or purged is *resolved*: its ``dlq_id`` is in the
  Cassandra table ``dlq_resolved`` (``schemas/cql/0003_dlq.cql``) and every read skips it
  unless asked otherwise. Kafka keeps the record until retention or ``purge --before``.
- State changes of one dead letter are lightweight transactions, so two operators never both
  replay it.
- Every operator action leaves a row in ``dlq_audit`` (who, when, what, why).
- A replay may *reopen* the message it belongs to: a message that ended FAILED or EXPIRED
  is set back to QUEUED (``reason=dlq_replay``, a compare-and-set on the status rank it was
  read with, plus a ``message_events`` row), so the statuses of the new attempts can apply.
  This is the one status write outside the API and the reconcile flow.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from cassandra.cluster import Session

from notiflow.adapters.cassandra.session import aio, connect
from notiflow.adapters.cassandra.values import utc
from notiflow.adapters.dlq.reader import DlqReadError
from notiflow.schemas.enums import Status
from notiflow.schemas.status import rank
from notiflow.settings import Settings

RESOLVED_SHARDS = 32
REOPEN_REASON = "dlq_replay"
REPLAY_SOURCE = "dlq.replay"
"""``source`` of the ``message_events`` rows a replay writes."""


@dataclass(frozen=True)
class MessageState:
    """What Cassandra knows of the message a dead letter belongs to."""

    status: Status | None
    """None: no row (not written yet, a direct producer's record, or expired by TTL)."""
    status_rank: int
    attempt: int
    """The attempt of the current status."""
    reason: str | None
    expires_at: datetime | None
    highest_attempt: int
    """The highest attempt number the row and the ``attempts`` table know."""


@dataclass(frozen=True)
class Resolution:
    """A ``dlq_resolved`` row."""

    dlq_id: str
    state: str
    at: datetime
    actor: str
    reason: str
    message_id: str | None
    attempt: int | None
    detail: dict[str, Any]


@dataclass(frozen=True)
class AuditRow:
    """A ``dlq_audit`` row: ``tier`` is the DLQ the record lives in (P0..P3, reconcile,
    webhooks); ``day`` is the UTC date of ``at``."""

    tier: str
    at: datetime
    dlq_id: str
    action: str
    actor: str
    reason: str
    message_id: str | None
    detail: dict[str, Any] = field(default_factory=dict)


def resolved_shard(dlq_id: str) -> int:
    return zlib.crc32(dlq_id.encode()) % RESOLVED_SHARDS


def _resolution(row: dict[str, Any]) -> Resolution:
    return Resolution(
        dlq_id=row["dlq_id"], state=row["state"], at=utc(row["at"]) or datetime.now(UTC),
        actor=row.get("actor") or "", reason=row.get("reason") or "",
        message_id=row.get("message_id"), attempt=row.get("attempt"),
        detail=orjson.loads(row["detail"]) if row.get("detail") else {})


_COLUMNS = "dlq_id, state, at, actor, reason, message_id, attempt, detail"
_LEDGER: dict[str, str] = {
    "lookup": f"SELECT {_COLUMNS} FROM dlq_resolved WHERE topic = ? AND shard = ? "
    "AND dlq_id IN ?",
    "get": f"SELECT {_COLUMNS} FROM dlq_resolved WHERE topic = ? AND shard = ? AND dlq_id = ?",
    "claim": "INSERT INTO dlq_resolved (topic, shard, dlq_id, state, at, actor, reason, "
    "message_id, attempt, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "reclaim": "UPDATE dlq_resolved SET state = ?, at = ?, actor = ?, reason = ?, "
    "message_id = ?, attempt = ?, detail = ? WHERE topic = ? AND shard = ? AND dlq_id = ? "
    "IF state = ? AND at = ?",
    "unclaim": "DELETE FROM dlq_resolved WHERE topic = ? AND shard = ? AND dlq_id = ? "
    "IF state = ?",
    "message": "SELECT status, status_rank, reason, attempt, expires_at FROM messages "
    "WHERE message_id = ?",
    "attempts": "SELECT attempt_no FROM attempts WHERE message_id = ?",
    "set_status": "UPDATE messages SET status = ?, status_rank = ?, reason = ?, "
    "next_attempt_at = ?, expires_at = ?, updated_at = ? WHERE message_id = ? "
    "IF status_rank = ?",
    "event": "INSERT INTO message_events (message_id, occurred_at, event_id, status, attempt, "
    "reason, source, applied) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    "audit": "INSERT INTO dlq_audit (tier, day, at, dlq_id, action, actor, reason, "
    "message_id, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
}


class DlqLedger:
    """The resolved set and the audit trail in Cassandra (``dlq_resolved``, ``dlq_audit``).

    State changes of one dead letter are lightweight transactions, so two operators never
    both replay it."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._stmts = {name: session.prepare(cql) for name, cql in _LEDGER.items()}

    def _run(self, name: str, params: tuple[Any, ...]) -> asyncio.Future[list[dict[str, Any]]]:
        return aio(self.session.execute_async(self._stmts[name], params))

    async def resolutions(self, topic: str, ids: Iterable[str]) -> dict[str, Resolution]:
        """The resolutions among ``ids`` of dead letters of ``topic``."""
        by_shard: dict[int, list[str]] = defaultdict(list)
        for i in set(ids):
            by_shard[resolved_shard(i)].append(i)
        found = await asyncio.gather(*(self._run("lookup", (topic, shard, chunk))
                                       for shard, chunk in by_shard.items()))
        return {row["dlq_id"]: _resolution(row) for rows in found for row in rows}

    async def resolution(self, topic: str, dlq_id: str) -> Resolution | None:
        rows = await self._run("get", (topic, resolved_shard(dlq_id), dlq_id))
        return _resolution(rows[0]) if rows else None

    async def claim(self, topic: str, dlq_id: str, state: str, at: datetime, actor: str,
                    reason: str, message_id: str | None, attempt: int | None,
                    detail: Mapping[str, Any], previous: Resolution | None = None) -> bool:
        """Set the resolution of ``dlq_id`` if it is still ``previous`` (None: unresolved);
        False when someone else changed it first."""
        doc = orjson.dumps(dict(detail)).decode()
        shard = resolved_shard(dlq_id)
        if previous is None:
            rows = await self._run("claim", (topic, shard, dlq_id, state, at, actor, reason,
                                             message_id, attempt, doc))
        else:
            rows = await self._run("reclaim", (state, at, actor, reason, message_id, attempt,
                                               doc, topic, shard, dlq_id, previous.state,
                                               previous.at))
        return bool(rows and rows[0].get("[applied]"))

    async def restore(self, topic: str, dlq_id: str, current: Resolution,
                      previous: Resolution | None) -> None:
        """Undo a claim (``current``) that could not be completed."""
        if previous is None:
            await self._run("unclaim", (topic, resolved_shard(dlq_id), dlq_id, current.state))
            return
        await self.claim(topic, dlq_id, previous.state, previous.at, previous.actor,
                         previous.reason, previous.message_id, previous.attempt,
                         previous.detail, previous=current)

    async def message_state(self, message_id: str) -> MessageState:
        """The message's row (if any) and the highest attempt it and its ``attempts`` rows
        know."""
        rows, attempts = await asyncio.gather(self._run("message", (message_id,)),
                                              self._run("attempts", (message_id,)))
        row = rows[0] if rows else {}
        status = row.get("status")
        attempt = int(row.get("attempt") or 0)
        highest = max([attempt, *(int(a["attempt_no"]) for a in attempts)])
        return MessageState(Status(status) if status else None, int(row.get("status_rank") or 0),
                            attempt, row.get("reason"), utc(row.get("expires_at")), highest)

    async def reopen(self, message_id: str, state: MessageState, *, attempt: int,
                     expires_at: datetime, at: datetime, dlq_id: str) -> bool:
        """Set a message that ended (``state``) back to QUEUED for the replay of ``dlq_id``
        as ``attempt``, if its status is still the one read; False when it changed."""
        return await self._set_status(message_id, state.status_rank, Status.QUEUED,
                                      rank(Status.QUEUED), REOPEN_REASON, expires_at, at,
                                      attempt,
                                      f"{message_id}:dlq_replay:{dlq_id}:{attempt}")

    async def undo_reopen(self, message_id: str, state: MessageState, *, attempt: int,
                          at: datetime, dlq_id: str) -> bool:
        """Put back the status :meth:`reopen` replaced (the replay was not produced)."""
        assert state.status is not None
        return await self._set_status(message_id, rank(Status.QUEUED), state.status,
                                      state.status_rank, state.reason, state.expires_at, at,
                                      state.attempt,
                                      f"{message_id}:dlq_replay_undone:{dlq_id}:{attempt}")

    async def _set_status(self, message_id: str, expected_rank: int, status: Status,
                          new_rank: int, reason: str | None, expires_at: datetime | None,
                          at: datetime, attempt: int, event_id: str) -> bool:
        rows = await self._run("set_status", (status.value, new_rank, reason, None, expires_at,
                                              at, message_id, expected_rank))
        if not (rows and rows[0].get("[applied]")):
            return False
        await self._run("event", (message_id, at, event_id, status.value, attempt, reason,
                                  REPLAY_SOURCE, True))
        return True

    async def audit(self, row: AuditRow) -> None:
        at = row.at.astimezone(UTC)
        await self._run("audit", (row.tier, at.date(), at, row.dlq_id, row.action, row.actor,
                                  row.reason, row.message_id,
                                  orjson.dumps(row.detail).decode()))


@dataclass
class LedgerSession:
    """A Cassandra connection with a :class:`DlqLedger`; close it with :meth:`close`."""

    cluster: Any
    session: Session
    ledger: DlqLedger

    @classmethod
    async def open(cls, settings: Settings) -> LedgerSession:
        try:
            cluster, session = await asyncio.to_thread(connect, settings)
        except Exception as exc:
            raise DlqReadError(f"cannot connect to Cassandra keyspace "
                               f"{settings.cassandra_keyspace}: {exc}") from None
        try:
            ledger = await asyncio.to_thread(DlqLedger, session)
        except Exception as exc:
            cluster.shutdown()
            raise DlqReadError(f"DLQ tables missing or Cassandra unreachable ({exc}); run "
                               "`notiflow stack migrate`") from None
        return cls(cluster, session, ledger)

    def close(self) -> None:
        self.cluster.shutdown()
