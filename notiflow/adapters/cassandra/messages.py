"""Messages: the row of each message, its tenant-history row, its status history and its
``failures_by_tier_day`` rows (``ops/queries.md``).

Status transitions are read-then-write with write times ordered by ``status_rank``
(``schemas/status.py``, :func:`rank_write_time`), no Paxos round per message; rows whose
status cells carry another write time keep the compare-and-set path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from notiflow.adapters.cassandra.session import Row, Statements, Write
from notiflow.adapters.cassandra.values import (
    capped_ttl,
    date_of,
    operator_shard,
    to_ms,
    ts,
    utc,
)
from notiflow.adapters.rows import MessageEventRow, MessageHeadRow, MessageRow
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import MessageSnapshot
from notiflow.schemas.status import rank, write_offset_us
from notiflow.settings import Settings

FAILURE_STATUSES = frozenset({Status.FAILED, Status.EXPIRED, Status.BOUNCED})
"""Statuses indexed in ``failures_by_tier_day``."""


def message_head(row: Row) -> MessageHeadRow:
    """A ``msg_head`` read as a :class:`MessageHeadRow`."""
    g = row.get
    return MessageHeadRow(g("status_rank"), g("status"), g("attempt"), g("reason"),
                       utc(g("updated_at")), g("provider_id"), g("tier"), g("tenant_id"),
                       g("channel"), g("category"), g("created_wt"), g("status_wt"))


def message_row(row: Row) -> MessageRow:
    """A ``messages`` row (``SELECT *``) as a :class:`MessageRow`."""
    g = row.get
    return MessageRow(
        row["message_id"], g("tenant_id"), g("channel"), g("tier"), g("category"),
        g("recipient_hash"), g("recipient_masked"), g("template_id"), g("template_version"),
        g("idempotency_key"), g("ordering_key"), g("status_webhook"), g("status"),
        g("status_rank"), g("reason"), g("attempt"), g("provider_id"),
        g("provider_message_id"), utc(g("next_attempt_at")), utc(g("scheduled_at")),
        utc(g("expires_at")), utc(g("accepted_at")), utc(g("created_at")),
        utc(g("updated_at")))


def message_event(row: Row) -> MessageEventRow:
    """A ``message_events`` row as a :class:`MessageEventRow`."""
    return MessageEventRow(
        row["message_id"], utc(row["occurred_at"]), row["event_id"], row["status"],
        int(row.get("attempt") or 0), row.get("reason"), row.get("source"),
        bool(row.get("applied")))


def created_write_time(snap: MessageSnapshot) -> int:
    """Write time (micro-seconds) of a message row's creation: its acceptance time."""
    return int(snap.accepted_at.timestamp() * 1_000_000)


def rank_write_time(head: MessageHeadRow, r: int) -> int | None:
    """Write time of a transition to rank ``r``: the row's creation write time +
    :func:`write_offset_us` of ``r``, so a higher rank always carries a later time, at most
    0.13 s after acceptance. None when the row's status cells carry another time (written by
    compare-and-set: an older release, a DLQ replay's re-queue) or a rank has no offset: such
    rows keep using compare-and-set."""
    created, written = head.created_wt, head.status_wt
    offset, current = write_offset_us(r), write_offset_us(head.status_rank or 0)
    if created is None or written is None or offset is None or current is None:
        return None
    if written not in (created, created + current):
        return None
    return int(created) + offset


class MessageStore:
    """Message rows, their creation, status transitions and history."""

    def __init__(self, cql: Statements, settings: Settings) -> None:
        self.cql = cql
        self.settings = settings
        cql.prepare(STATEMENTS)
        cql.prepare(OPERATOR_STATEMENTS, optional=True)
        cql.keyed("msg_head", "message_id", "message_id, ")

    async def create_message(
        self, message_id: str, snap: MessageSnapshot, status: Status, now: datetime,
        source: str = "api", fresh: bool = False, also: Sequence[Write] = (),
    ) -> bool:
        """Write the message row unless it exists, its tenant-history row and the first entry
        of its status history; True if written. The row is written at its acceptance time
        (micro-seconds), the anchor of :func:`rank_write_time`, so it never overwrites a
        later status change. ``fresh``: the caller knows the row is absent (an id just
        minted, or a :meth:`head` read that found nothing), so it is not read first. Two
        writers racing on an absent row write the same cells at the same time (idempotent).
        ``also``: further writes sent in the same request (written in either case)."""
        if not fresh and await self.head(message_id) is not None:
            await self.cql.write_all(also)
            return False
        await self.cql.write_all([*also, *self.creation_writes(message_id, snap, status, now,
                                                               source)])
        return True

    def creation_writes(self, message_id: str, snap: MessageSnapshot, status: Status,
                        now: datetime, source: str) -> list[Write]:
        """The writes of :meth:`create_message` (for ``write_all``)."""
        values = (
            message_id, snap.tenant_id, snap.channel.value, snap.tier.value,
            snap.category.value, snap.recipient_hash, snap.recipient_masked, snap.template_id,
            snap.template_version, snap.idempotency_key, snap.ordering_key, snap.status_webhook,
            status.value, rank(status), 0, ts(snap.scheduled_at), ts(snap.expires_at),
            ts(snap.accepted_at), now, now,
        )
        ttl = self.row_ttl(snap, now)
        return [
            ("msg_insert", (*values, created_write_time(snap), ttl)),
            ("tenant_day_insert", (
                snap.tenant_id, date_of(snap.accepted_at), ts(snap.accepted_at),
                message_id, snap.channel.value, snap.tier.value, snap.category.value, ttl,
            )),
            self.event_write(message_id, snap.accepted_at, f"{message_id}:{status.value}:0",
                             status, 0, None, source, True),
        ]

    def row_ttl(self, snap: MessageSnapshot, now: datetime) -> int:
        """Seconds a message's creation cells live: the operational retention counted from
        the end of its life (``expires_at``; a message scheduled weeks ahead stays queryable
        30 days after it was sent), never less than the retention itself. Later status
        changes are written with the table's TTL from their own time. Never beyond what
        Cassandra takes (20 years, cells expiring before 2038-01-19), whatever
        ``expires_at`` says."""
        ttl = self.settings.operational_ttl
        if snap.expires_at is not None:
            ttl += max(timedelta(0), snap.expires_at - now)
        return capped_ttl(ttl.total_seconds(), now)

    @staticmethod
    def created_head(snap: MessageSnapshot, status: Status, now: datetime) -> MessageHeadRow:
        """The :meth:`head` of a row :meth:`create_message` just wrote (no read needed)."""
        at = created_write_time(snap)
        return MessageHeadRow(rank(status), status.value, 0, None, now, None, snap.tier.value,
                           snap.tenant_id, snap.channel.value, snap.category.value, at, at)

    async def head(self, message_id: str) -> MessageHeadRow | None:
        """The message row's status columns and write times (for :meth:`transition`)."""
        row = await self.cql.read("msg_head", (), message_id)
        return message_head(row) if row is not None else None

    def heads(self, message_ids: Sequence[str]) -> Awaitable[list[MessageHeadRow | None]]:
        """:meth:`head` of each id, in order (``IN`` reads of ``max_keys`` ids when
        coalescing; the reads are queued by this call, not when awaited)."""
        reads = self.cql.read_each("msg_head", [((), m) for m in message_ids])

        async def mapped() -> list[MessageHeadRow | None]:
            return [message_head(r) if r is not None else None for r in await reads]

        return mapped()

    async def get_message(self, message_id: str) -> MessageRow | None:
        row = await self.cql.first("msg_get", (message_id,))
        return message_row(row) if row is not None else None

    async def delete_unsent_message(
        self, message_id: str, tenant_id: str, accepted_at: datetime, max_status: Status
    ) -> bool:
        """Delete a message row that never got past ``max_status`` (LWT), and its
        tenant-history row; True if the row was deleted or did not exist. Used to undo an
        acceptance whose ingest record was never published."""
        row = await self.cql.first("msg_delete_unsent", (message_id, rank(max_status))) or {}
        gone = bool(row.get("[applied]")) or row.get("status_rank") is None
        if gone:
            await asyncio.gather(
                self.cql.run("tenant_day_delete", (
                    tenant_id, date_of(accepted_at), ts(accepted_at), message_id,
                )),
                self.cql.run("events_delete", (message_id,)),
            )
        return gone

    async def transition(
        self, message_id: str, status: Status, attempt: int, reason: str | None,
        now: datetime, provider_id: str | None = None, provider_message_id: str | None = None,
        next_attempt_at: datetime | None = None, *, head: MessageHeadRow | None = None,
        then: Callable[[bool], Sequence[Write]] | None = None,
    ) -> tuple[bool, bool]:
        """Move the status forward if ``status`` outranks the current one; returns
        (applied, row_exists). ``head``: the row's :meth:`head`, when the caller has it;
        ``then(applied)``: more writes (history, attempts…) sent in the same request as the
        status write; not written when the row does not exist.

        Not a compare-and-set: the row is read, then its status cells are written at
        :func:`rank_write_time`, so whatever order concurrent transitions land in, the
        highest rank's cells win and the status never regresses; ``applied`` may be True for
        two racing writers of which only the higher rank shows. Rows whose status cells carry
        another write time (an older release's compare-and-set, a DLQ replay's re-queue)
        keep the compare-and-set path."""
        row = head if head is not None else await self.head(message_id)
        if row is None:
            return False, False
        planned = self.planned_transition(message_id, status, attempt, reason, now,
                                          provider_id, provider_message_id, next_attempt_at,
                                          head=row)
        if planned is None:
            applied, exists = await self._cas_transition(
                message_id, status, attempt, reason, now, provider_id, provider_message_id,
                next_attempt_at, row)
            if then is not None:
                await self.cql.write_all(then(applied))
            return applied, exists
        applied, writes = planned
        if then is not None:
            writes += then(applied)
        await self.cql.write_all(writes)
        return applied, True

    def planned_transition(
        self, message_id: str, status: Status, attempt: int, reason: str | None,
        now: datetime, provider_id: str | None = None, provider_message_id: str | None = None,
        next_attempt_at: datetime | None = None, *, head: MessageHeadRow,
    ) -> tuple[bool, list[Write]] | None:
        """Whether :meth:`transition` from the existing row ``head`` applies, and its writes
        (nothing is sent); None when the row keeps the compare-and-set path."""
        r = rank(status, attempt)
        at = rank_write_time(head, r)
        if at is None:
            return None
        current = head.status_rank
        applied = current is None or current < r
        writes: list[Write] = []
        if applied:
            writes.append(("msg_advance", (
                at, status.value, r, reason, attempt, now, provider_id, provider_message_id,
                ts(next_attempt_at), message_id,
            )))
        if status in FAILURE_STATUSES and (applied or current == r):
            failure = self._failure_write(message_id, status, r, attempt, reason, provider_id,
                                          to_ms(now) if applied else None, head)
            writes += [failure] if failure else []
        return applied, writes

    async def _cas_transition(
        self, message_id: str, status: Status, attempt: int, reason: str | None,
        now: datetime, provider_id: str | None, provider_message_id: str | None,
        next_attempt_at: datetime | None, head: MessageHeadRow,
    ) -> tuple[bool, bool]:
        """The compare-and-set transition (``head``: the row as read before it)."""
        r = rank(status, attempt)
        row = await self.cql.first("msg_transition", (
            status.value, r, reason, attempt, now, provider_id, provider_message_id,
            ts(next_attempt_at), message_id, r,
        )) or {}
        applied = bool(row.get("[applied]"))
        exists = applied or row.get("status_rank") is not None
        if status in FAILURE_STATUSES and (applied or row.get("status_rank") == r):
            failure = self._failure_write(message_id, status, r, attempt, reason, provider_id,
                                          to_ms(now) if applied else None, head)
            if failure is not None:
                await self.cql.run(*failure)
        return applied, exists

    def _failure_write(
        self, message_id: str, status: Status, r: int, attempt: int, reason: str | None,
        provider_id: str | None, failed_at: datetime | None, msg: MessageHeadRow | None,
    ) -> Write | None:
        """The ``failures_by_tier_day`` row of a transition into a failure status.
        ``failed_at`` None: a replayed transition that was already applied; the row is
        rewritten from the message row (same key, its ``updated_at``) while the message is
        still in that status, so replays never add a second row. ``msg``: the message row
        as it was before the transition."""
        if not self.cql.has("failure_insert") or msg is None or not msg.tier:
            return None
        if failed_at is None:
            if msg.status_rank != r or msg.updated_at is None:
                return None
            failed_at = msg.updated_at
            attempt, reason = int(msg.attempt or 0), msg.reason
            provider_id = msg.provider_id
        return ("failure_insert", (
            msg.tier, date_of(failed_at), operator_shard(message_id), failed_at, message_id,
            status.value, reason, msg.tenant_id, msg.channel, msg.category, attempt,
            provider_id or msg.provider_id,
        ))

    @staticmethod
    def event_write(
        message_id: str, occurred_at: datetime, event_id: str, status: Status,
        attempt: int, reason: str | None, source: str, applied: bool,
    ) -> Write:
        """The status-history row (for ``write_all``)."""
        return ("event_insert", (message_id, ts(occurred_at), event_id, status.value, attempt,
                                 reason, source, applied))

    async def events(self, message_id: str) -> list[MessageEventRow]:
        """The message's status history, oldest first."""
        return [message_event(r) for r in await self.cql.run("events_get", (message_id,))]


STATEMENTS: dict[str, str] = {
    "msg_insert": "INSERT INTO messages (message_id, tenant_id, channel, tier, category, "
    "recipient_hash, recipient_masked, template_id, template_version, idempotency_key, "
    "ordering_key, status_webhook, status, status_rank, attempt, scheduled_at, expires_at, "
    "accepted_at, created_at, updated_at) VALUES "
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ? AND TTL ?",
    "msg_head": "SELECT status_rank, status, attempt, reason, updated_at, provider_id, tier, "
    "tenant_id, channel, category, WRITETIME(tenant_id) AS created_wt, "
    "WRITETIME(status_rank) AS status_wt FROM messages WHERE message_id = ?",
    "msg_advance": "UPDATE messages USING TIMESTAMP ? SET status = ?, status_rank = ?, "
    "reason = ?, attempt = ?, updated_at = ?, provider_id = ?, provider_message_id = ?, "
    "next_attempt_at = ? WHERE message_id = ?",
    "tenant_day_insert": "INSERT INTO messages_by_tenant_day (tenant_id, day, created_at, "
    "message_id, channel, tier, category) VALUES (?, ?, ?, ?, ?, ?, ?) USING TTL ?",
    "msg_get": "SELECT * FROM messages WHERE message_id = ?",
    "msg_delete_unsent": "DELETE FROM messages WHERE message_id = ? IF status_rank <= ?",
    "tenant_day_delete": "DELETE FROM messages_by_tenant_day WHERE tenant_id = ? AND day = ? "
    "AND created_at = ? AND message_id = ?",
    "msg_transition": "UPDATE messages SET status = ?, status_rank = ?, reason = ?, attempt = ?, "
    "updated_at = ?, provider_id = ?, provider_message_id = ?, next_attempt_at = ? "
    "WHERE message_id = ? IF status_rank < ?",
    "event_insert": "INSERT INTO message_events (message_id, occurred_at, event_id, status, "
    "attempt, reason, source, applied) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    "events_get": "SELECT * FROM message_events WHERE message_id = ?",
    "events_delete": "DELETE FROM message_events WHERE message_id = ?",
}

OPERATOR_STATEMENTS: dict[str, str] = {
    "failure_insert": "INSERT INTO failures_by_tier_day (tier, day, shard, failed_at, "
    "message_id, status, reason, tenant_id, channel, category, attempt, provider_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
}
"""Writes to migration 0004's table; prepared separately so a store started before that
migration still works (it skips these writes and logs an error)."""

