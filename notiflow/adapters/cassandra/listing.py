"""A tenant's recent messages, newest first: pages of ``messages_by_tenant_day`` joined with
each message's current row."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from notiflow.adapters.cassandra.messages import MessageStore
from notiflow.adapters.cassandra.session import Row, Statements
from notiflow.adapters.cassandra.values import date_of, utc
from notiflow.adapters.rows import MessageRow
from notiflow.schemas.enums import Status

LIST_MAX_SCAN = 1000
"""Index rows one :meth:`MessageListing.recent_messages` call reads at most (bounds a
request whose status filter matches little); the page then ends early with a cursor."""
LIST_JOIN_CONCURRENCY = 64


@dataclass(frozen=True)
class Cursor:
    """Position in a tenant's newest-first message list: the last row already returned.
    Opaque to clients (:meth:`encode`); only ever applied to the caller's own tenant."""

    created_at: datetime
    message_id: str

    def encode(self) -> str:
        ms = int(self.created_at.timestamp() * 1000)
        raw = f"{ms}:{self.message_id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        """Raises ValueError for anything :meth:`encode` did not produce."""
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            ms, _, message_id = raw.partition(":")
            if not message_id or len(message_id) > 64 or not ms.isdigit():
                raise ValueError(text)
            return cls(datetime.fromtimestamp(int(ms) / 1000, UTC), message_id)
        except (ValueError, UnicodeDecodeError, OverflowError) as exc:
            raise ValueError("malformed cursor") from exc


@dataclass(frozen=True)
class MessagePage:
    """One page of :meth:`MessageListing.recent_messages`: ``messages`` rows, newest
    acceptance first, and ``next``, where the following page starts (None when the range is
    exhausted)."""

    messages: list[MessageRow]
    next: Cursor | None


class MessageListing:
    """Pages of a tenant's messages (the index rows :class:`MessageStore` writes)."""

    def __init__(self, cql: Statements, messages: MessageStore) -> None:
        self.cql = cql
        self.messages = messages
        cql.prepare(STATEMENTS)

    async def recent_messages(
        self, tenant_id: str, since: datetime, *, limit: int, now: datetime,
        status: Status | None = None, after: Cursor | None = None,
        max_scan: int = LIST_MAX_SCAN,
    ) -> MessagePage:
        """A tenant's messages accepted at or after ``since``, newest first, joined with
        their current row (``messages``), optionally only those now in ``status``.

        Walks ``messages_by_tenant_day`` partitions from ``after``'s day (else ``now``'s)
        back to ``since``'s day. At most ``limit`` messages and ``max_scan`` index rows per
        call: when either bound stops the walk, ``next`` is the position of the last index
        row read, so the caller resumes exactly there; rows whose message row is gone
        (TTL) or belongs to another tenant are skipped."""
        since = since.astimezone(UTC)
        start = (after.created_at if after else now).astimezone(UTC)
        day, first_day = date_of(start), date_of(since)
        position = after
        found: list[MessageRow] = []
        scanned = 0
        sem = asyncio.Semaphore(LIST_JOIN_CONCURRENCY)

        async def joined(message_id: str) -> MessageRow | None:
            async with sem:
                return await self.messages.get_message(message_id)

        while day >= first_day:
            want = min(max(limit - len(found), 50), 500, max_scan - scanned)
            same_day = position is not None and date_of(position.created_at) == day
            index = await self._tenant_day_page(tenant_id, day, since,
                                                position if same_day else None, want)
            rows = await asyncio.gather(*(joined(i["message_id"]) for i in index))
            for i, row in zip(index, rows, strict=True):
                scanned += 1
                position = Cursor(utc(i["created_at"]) or since, i["message_id"])
                if row is None or row.tenant_id != tenant_id:
                    continue
                if status is not None and row.status != status.value:
                    continue
                found.append(row)
                if len(found) >= limit:
                    return MessagePage(found, position)
            if scanned >= max_scan:
                return MessagePage(found, position)
            if len(index) < want:
                day -= timedelta(days=1)
        return MessagePage(found, None)

    async def _tenant_day_page(self, tenant_id: str, day: date, since: datetime,
                               after: Cursor | None, n: int) -> list[Row]:
        """Up to ``n`` index rows of one day partition at or after ``since``, strictly after
        ``after`` in the clustering order (``created_at DESC, message_id ASC``)."""
        if after is None:
            return await self.cql.run("tenant_day_page", (tenant_id, day, since, n))
        ties = await self.cql.run("tenant_day_ties", (tenant_id, day, after.created_at,
                                                      after.message_id, n))
        if len(ties) >= n:
            return ties
        older = await self.cql.run("tenant_day_older", (tenant_id, day, after.created_at,
                                                        since, n - len(ties)))
        return ties + older


STATEMENTS: dict[str, str] = {
    "tenant_day_page": "SELECT created_at, message_id FROM messages_by_tenant_day "
    "WHERE tenant_id = ? AND day = ? AND created_at >= ? LIMIT ?",
    "tenant_day_ties": "SELECT created_at, message_id FROM messages_by_tenant_day "
    "WHERE tenant_id = ? AND day = ? AND created_at = ? AND message_id > ? LIMIT ?",
    "tenant_day_older": "SELECT created_at, message_id FROM messages_by_tenant_day "
    "WHERE tenant_id = ? AND day = ? AND created_at < ? AND created_at >= ? LIMIT ?",
}
