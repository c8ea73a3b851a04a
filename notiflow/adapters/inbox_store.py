"""The in-app inbox's storage and live feed.

:class:`InboxStore` reads and writes ``inbox_items`` / ``inbox_index`` (migration 0013): items
newest first per (tenant, user), content encrypted at rest, states as write-once times
(``inbox/states.py``), every write with the TTL left of ``inbox.retention``.

:class:`InboxFeed` publishes an inbox's events on Redis (``{ns}inbox:{tenant}:{user hash}``)
for the ``notiflow inbox`` processes, which hold one pattern subscription each. The feed is
best effort: a client that was away catches up from the store (``since``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import orjson
import redis.asyncio as aioredis
from cassandra.cluster import Session
from cassandra.query import PreparedStatement

from notiflow.adapters.cassandra.session import aio
from notiflow.adapters.cassandra.values import to_ms, utc
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.redis_pool import redis_client
from notiflow.inbox.states import InboxState, marks, state_of
from notiflow.redact import recipient_hash
from notiflow.settings import Settings

_ITEM = ("tenant_id, user_id, created_at, message_id, tier, category, attempt, content, "
         "seen_at, read_at, archived_at")
_STATEMENTS: Final = {
    "put": "INSERT INTO inbox_items (tenant_id, user_id, created_at, message_id, tier, "
           "category, attempt, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?) USING TTL ?",
    "index": "INSERT INTO inbox_index (tenant_id, user_id, message_id, created_at) "
             "VALUES (?, ?, ?, ?) USING TTL ?",
    "find": "SELECT created_at FROM inbox_index WHERE tenant_id = ? AND user_id = ? "
            "AND message_id = ?",
    "get": f"SELECT {_ITEM} FROM inbox_items WHERE tenant_id = ? AND user_id = ? "
           "AND created_at = ? AND message_id = ?",
    "first": f"SELECT {_ITEM} FROM inbox_items WHERE tenant_id = ? AND user_id = ? LIMIT ?",
    "before": f"SELECT {_ITEM} FROM inbox_items WHERE tenant_id = ? AND user_id = ? "
              "AND (created_at, message_id) < (?, ?) LIMIT ?",
    "after": f"SELECT {_ITEM} FROM inbox_items WHERE tenant_id = ? AND user_id = ? "
             "AND (created_at, message_id) > (?, ?) LIMIT ?",
    "erase_items": "DELETE FROM inbox_items WHERE tenant_id = ? AND user_id = ?",
    "erase_index": "DELETE FROM inbox_index WHERE tenant_id = ? AND user_id = ?",
}
_MARK: Final = {frozenset(cols): "UPDATE inbox_items USING TTL ? SET " + ", ".join(
    f"{c} = ?" for c in sorted(cols)) + " WHERE tenant_id = ? AND user_id = ? AND "
    "created_at = ? AND message_id = ?" for cols in (
    {"seen_at"}, {"read_at"}, {"archived_at"}, {"seen_at", "read_at"},
    {"seen_at", "archived_at"}, {"read_at", "archived_at"},
    {"seen_at", "read_at", "archived_at"})}


@dataclass(frozen=True, slots=True)
class Cursor:
    """A place in one inbox: an item's ``(created_at, message_id)``, as text
    ``{epoch ms}.{message_id}`` (the SSE event id and the paging cursor)."""

    created_at: datetime
    message_id: str

    def text(self) -> str:
        return f"{round(self.created_at.timestamp() * 1000)}.{self.message_id}"

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """``ValueError`` for text that is no cursor."""
        ms, _, message_id = text.partition(".")
        if not ms.isdigit() or not message_id or len(message_id) > 64:
            raise ValueError("not an inbox cursor")
        return cls(datetime.fromtimestamp(int(ms) / 1000, tz=UTC), message_id)


@dataclass(frozen=True, slots=True)
class InboxItem:
    """One item of a user's inbox."""

    tenant_id: str
    user_id: str
    message_id: str
    created_at: datetime
    tier: str
    category: str
    attempt: int
    subject: str | None
    body: str
    seen_at: datetime | None = None
    read_at: datetime | None = None
    archived_at: datetime | None = None

    @property
    def state(self) -> InboxState:
        return state_of(self.times())

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.created_at, self.message_id)

    def times(self) -> dict[str, datetime | None]:
        return {"seen_at": self.seen_at, "read_at": self.read_at,
                "archived_at": self.archived_at}

    def view(self) -> dict[str, Any]:
        """The item as clients get it (JSON-ready)."""
        def iso(d: datetime | None) -> str | None:
            return d.isoformat() if d is not None else None

        return {"id": self.message_id, "cursor": self.cursor.text(), "tier": self.tier,
                "category": self.category, "subject": self.subject, "body": self.body,
                "created_at": iso(self.created_at), "state": self.state.value,
                "seen_at": iso(self.seen_at), "read_at": iso(self.read_at),
                "archived_at": iso(self.archived_at)}


class InboxStore:
    """Every Cassandra read and write of the inbox."""

    def __init__(self, session: Session, settings: Settings,
                 cipher: DlqCipher | None = None) -> None:
        self.session = session
        self.retention = settings.inbox.retention
        self.cipher = cipher or DlqCipher.from_settings(settings)
        self._stmts: dict[str, PreparedStatement] = {
            name: session.prepare(cql) for name, cql in _STATEMENTS.items()}
        self._marks = {cols: session.prepare(cql) for cols, cql in _MARK.items()}

    def _run(self, stmt: PreparedStatement, params: tuple[Any, ...]) -> Any:
        return aio(self.session.execute_async(stmt, params))

    def _ttl(self, created_at: datetime, now: datetime) -> int:
        return max(1, int((created_at + self.retention - now).total_seconds()))

    async def put(self, item: InboxItem, now: datetime) -> None:
        """Store ``item`` (its states untouched: storing it again changes nothing else)."""
        ttl = self._ttl(item.created_at, now)
        content = self.cipher.encrypt(orjson.dumps({"subject": item.subject,
                                                    "body": item.body})).encode()
        await self._run(self._stmts["put"], (
            item.tenant_id, item.user_id, item.created_at, item.message_id, item.tier,
            item.category, item.attempt, content, ttl))
        await self._run(self._stmts["index"], (item.tenant_id, item.user_id, item.message_id,
                                               item.created_at, ttl))

    async def erase(self, tenant_id: str, user_id: str) -> None:
        """Delete the user's inbox, every item and the index (an erasure)."""
        await self._run(self._stmts["erase_items"], (tenant_id, user_id))
        await self._run(self._stmts["erase_index"], (tenant_id, user_id))

    def _item(self, r: dict[str, Any]) -> InboxItem:
        content = orjson.loads(self.cipher.decrypt(bytes(r["content"]).decode()))
        return InboxItem(r["tenant_id"], r["user_id"], r["message_id"],
                         utc(r["created_at"]) or datetime.min, r["tier"] or "",
                         r["category"] or "", r["attempt"] or 1, content.get("subject"),
                         content.get("body") or "", utc(r.get("seen_at")),
                         utc(r.get("read_at")), utc(r.get("archived_at")))

    async def get(self, tenant_id: str, user_id: str, message_id: str) -> InboxItem | None:
        found = await self._run(self._stmts["find"], (tenant_id, user_id, message_id))
        if not found:
            return None
        rows = await self._run(self._stmts["get"], (tenant_id, user_id,
                                                    found[0]["created_at"], message_id))
        return self._item(rows[0]) if rows else None

    async def page(self, tenant_id: str, user_id: str, before: Cursor | None,
                   limit: int) -> list[InboxItem]:
        """Up to ``limit`` items older than ``before`` (the newest without), newest first."""
        if before is None:
            rows = await self._run(self._stmts["first"], (tenant_id, user_id, limit))
        else:
            rows = await self._run(self._stmts["before"], (
                tenant_id, user_id, before.created_at, before.message_id, limit))
        return [self._item(r) for r in rows]

    async def since(self, tenant_id: str, user_id: str, after: Cursor,
                    limit: int) -> tuple[list[InboxItem], bool]:
        """The items newer than ``after``, oldest first, when there are at most ``limit``;
        else the newest ``limit`` and True (a gap: the client pages for the rest)."""
        rows = await self._run(self._stmts["after"], (
            tenant_id, user_id, after.created_at, after.message_id, limit + 1))
        gap = len(rows) > limit
        return [self._item(r) for r in reversed(rows[:limit])], gap

    async def plan(self, tenant_id: str, user_id: str, message_id: str, target: InboxState,
                   now: datetime) -> tuple[InboxItem, InboxItem] | None:
        """The item as it is and as moving it forward to ``target`` at ``now`` leaves it
        (nothing written: :meth:`apply` writes it); None when the user has no such item."""
        item = await self.get(tenant_id, user_id, message_id)
        return None if item is None else (item, moved(item, target, to_ms(now)))

    async def apply(self, before: InboxItem, after: InboxItem, now: datetime) -> None:
        """Write the state columns ``after`` sets that ``before`` did not (none: no write).
        Writing them again sets the same states: a retry is harmless."""
        was = before.times()
        columns = {c: at for c, at in after.times().items() if at is not None and was[c] is None}
        if not columns:
            return
        names = sorted(columns)
        await self._run(self._marks[frozenset(names)], (
            self._ttl(before.created_at, now), *(columns[c] for c in names), before.tenant_id,
            before.user_id, before.created_at, before.message_id))


def moved(item: InboxItem, target: InboxState, now: datetime) -> InboxItem:
    """``item`` moved forward to ``target`` at ``now`` (:func:`~notiflow.inbox.states.marks`);
    ``item`` itself when it is there already or beyond."""
    columns = marks(target, item.times(), now)
    if not columns:
        return item
    return replace(item, seen_at=columns.get("seen_at", item.seen_at),
                   read_at=columns.get("read_at", item.read_at),
                   archived_at=columns.get("archived_at", item.archived_at))


def channel_key(namespace: str, tenant_id: str, user_id: str) -> str:
    """The Redis channel of one user's inbox events: the user id (the tenant's own
    identifier of a person) as its keyed recipient hash (``redact.recipient_hash``, first
    key only: a channel is live fan-out, never stored, and a client catches up from the
    inbox when it reconnects)."""
    return f"{namespace}inbox:{tenant_id}:{recipient_hash(tenant_id, user_id)}"


def channel_pattern(namespace: str) -> str:
    return f"{namespace}inbox:*"


class InboxFeed:
    """Publishes inbox events; each event carries ``published_at`` (epoch seconds) so the
    fan-out latency can be measured at the client."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.r = client
        self.ns = namespace

    @classmethod
    def open(cls, settings: Settings, timeout: float = 0.5) -> InboxFeed:
        return cls(redis_client(settings, timeout=timeout), settings.topic_prefix)

    async def publish(self, tenant_id: str, user_id: str, event: dict[str, Any]) -> int:
        """Publish ``event`` to the user's live connections; how many processes got it."""
        doc = {**event, "published_at": time.time()}
        return int(await self.r.publish(channel_key(self.ns, tenant_id, user_id),
                                        orjson.dumps(doc)))

    async def aclose(self) -> None:
        await self.r.aclose()

