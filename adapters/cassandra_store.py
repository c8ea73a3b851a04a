"""Cassandra: the operational source of truth (messages, attempts, idempotency, templates).

All statements are prepared once; every call is asynchronous (the driver's own I/O thread
resolves an asyncio future), so a Bytewax worker or the API loop can run many at once.
Status transitions are compare-and-set on ``status_rank`` (``schemas/status.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    ResponseFuture,
    Session,
)
from cassandra.policies import DCAwareRoundRobinPolicy, RetryPolicy
from cassandra.query import PreparedStatement, dict_factory

from notiflow.schemas.enums import Status
from notiflow.schemas.messages import AttemptRecord, MessageSnapshot
from notiflow.schemas.status import rank
from notiflow.settings import Settings

log = logging.getLogger(__name__)
logging.getLogger("cassandra").setLevel(logging.ERROR)

OUTBOX_SHARDS = 16


def connect(
    settings: Settings, keyspace: str | None = "", connect_timeout: float = 5.0
) -> tuple[Cluster, Session]:
    """Open a cluster connection; ``keyspace=""`` means the configured keyspace."""
    profile = ExecutionProfile(
        load_balancing_policy=DCAwareRoundRobinPolicy(local_dc="datacenter1"),
        retry_policy=RetryPolicy(),
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=10.0,
        row_factory=dict_factory,
    )
    cluster = Cluster(
        list(settings.cassandra_hosts),
        port=settings.cassandra_port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=connect_timeout,
        control_connection_timeout=connect_timeout,
        protocol_version=5,
    )
    ks = settings.cassandra_keyspace if keyspace == "" else keyspace
    try:
        session = cluster.connect(ks) if ks else cluster.connect()
    except Exception:
        cluster.shutdown()
        raise
    return cluster, session


def aio(rf: ResponseFuture) -> asyncio.Future[list[dict[str, Any]]]:
    """Bridge a driver ``ResponseFuture`` to the running asyncio loop (first page only)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[dict[str, Any]]] = loop.create_future()

    def _ok(rows: list[dict[str, Any]]) -> None:
        loop.call_soon_threadsafe(_resolve, fut, list(rows) if rows else [], None)

    def _err(exc: BaseException) -> None:
        loop.call_soon_threadsafe(_resolve, fut, None, exc)

    rf.add_callbacks(_ok, _err)
    return fut


def _resolve(fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


@dataclass(frozen=True)
class Reservation:
    """Outcome of reserving an idempotency key (a lightweight transaction)."""

    applied: bool
    existing: dict[str, Any] | None


def _ts(d: datetime | None) -> datetime | None:
    return d.astimezone(UTC) if d is not None else None


def utc(d: datetime | None) -> datetime | None:
    """Cassandra returns naive UTC timestamps; make them aware."""
    if d is None:
        return None
    return d.replace(tzinfo=UTC) if d.tzinfo is None else d


class CassandraStore:
    """Every read and write notiflow makes to Cassandra."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.settings = settings
        self._idem_ttl = int(settings.idempotency_ttl.total_seconds())
        self._stmts: dict[str, PreparedStatement] = {}
        for name, cql in _STATEMENTS.items():
            self._stmts[name] = session.prepare(cql)
        self._stmts["reserve"] = session.prepare(
            "INSERT INTO idempotency (tenant_id, idempotency_key, request_hash, message_id, "
            "state, topic, payload, created_at) VALUES (?, ?, ?, ?, 'PENDING', ?, ?, ?) "
            f"IF NOT EXISTS USING TTL {self._idem_ttl}"
        )
        self._stmts["idem_accept"] = session.prepare(
            "UPDATE idempotency USING TTL " + str(self._idem_ttl) + " SET state = 'ACCEPTED', "
            "response = ? WHERE tenant_id = ? AND idempotency_key = ?"
        )

    def _run(self, name: str, params: Sequence[Any]) -> asyncio.Future[list[dict[str, Any]]]:
        return aio(self.session.execute_async(self._stmts[name], params))

    # ------------------------------------------------------------------- idempotency/outbox

    async def reserve(
        self, tenant_id: str, key: str, request_hash: str, message_id: str, topic: str,
        payload: str, created_at: datetime,
    ) -> Reservation:
        rows = await self._run(
            "reserve", (tenant_id, key, request_hash, message_id, topic, payload, created_at)
        )
        row = rows[0] if rows else {"[applied]": False}
        if row.get("[applied]"):
            return Reservation(True, None)
        return Reservation(False, row)

    async def get_reservation(self, tenant_id: str, key: str) -> dict[str, Any] | None:
        rows = await self._run("idem_get", (tenant_id, key))
        return rows[0] if rows else None

    async def accept_reservation(self, tenant_id: str, key: str, response: str) -> None:
        await self._run("idem_accept", (response, tenant_id, key))

    async def drop_reservation(self, tenant_id: str, key: str) -> None:
        await self._run("idem_delete", (tenant_id, key))

    async def outbox_add(self, shard: int, created_at: datetime, tenant_id: str, key: str) -> None:
        await self._run("outbox_add", (shard, created_at, tenant_id, key))

    async def outbox_remove(
        self, shard: int, created_at: datetime, tenant_id: str, key: str
    ) -> None:
        await self._run("outbox_remove", (shard, created_at, tenant_id, key))

    async def outbox_due(self, shard: int, older_than: datetime) -> list[dict[str, Any]]:
        return await self._run("outbox_due", (shard, older_than))

    # -------------------------------------------------------------------------- messages

    async def create_message(
        self, message_id: str, snap: MessageSnapshot, status: Status, now: datetime,
        source: str = "api",
    ) -> bool:
        """Insert the message row if absent (LWT), its tenant-history row and the first entry
        of its status history; True if new."""
        rows = await self._run("msg_insert", (
            message_id, snap.tenant_id, snap.channel.value, snap.tier.value,
            snap.category.value, snap.recipient_hash, snap.recipient_masked, snap.template_id,
            snap.template_version, snap.idempotency_key, snap.ordering_key, snap.status_webhook,
            status.value, rank(status), 0, _ts(snap.scheduled_at), _ts(snap.expires_at),
            _ts(snap.accepted_at), now, now,
        ))
        created = bool(rows and rows[0].get("[applied]"))
        if created:
            await asyncio.gather(
                self._run("tenant_day_insert", (
                    snap.tenant_id, date_of(snap.accepted_at), _ts(snap.accepted_at),
                    message_id, snap.channel.value, snap.tier.value, snap.category.value,
                )),
                self.record_event(message_id, snap.accepted_at, f"{message_id}:{status.value}:0",
                                  status, 0, None, source, True),
            )
        return created

    async def get_message(self, message_id: str) -> dict[str, Any] | None:
        rows = await self._run("msg_get", (message_id,))
        return rows[0] if rows else None

    async def delete_unsent_message(
        self, message_id: str, tenant_id: str, accepted_at: datetime, max_status: Status
    ) -> bool:
        """Delete a message row that never got past ``max_status`` (LWT), and its
        tenant-history row; True if the row was deleted or did not exist. Used to undo an
        acceptance whose ingest record was never published."""
        rows = await self._run("msg_delete_unsent", (message_id, rank(max_status)))
        row = rows[0] if rows else {}
        gone = bool(row.get("[applied]")) or row.get("status_rank") is None
        if gone:
            await asyncio.gather(
                self._run("tenant_day_delete", (
                    tenant_id, date_of(accepted_at), _ts(accepted_at), message_id,
                )),
                self._run("events_delete", (message_id,)),
            )
        return gone

    async def transition(
        self, message_id: str, status: Status, attempt: int, reason: str | None,
        now: datetime, provider_id: str | None = None, provider_message_id: str | None = None,
        next_attempt_at: datetime | None = None,
    ) -> tuple[bool, bool]:
        """Compare-and-set the status if it moves forward; returns (applied, row_exists)."""
        r = rank(status, attempt)
        rows = await self._run("msg_transition", (
            status.value, r, reason, attempt, now, provider_id, provider_message_id,
            _ts(next_attempt_at), message_id, r,
        ))
        row = rows[0] if rows else {}
        applied = bool(row.get("[applied]"))
        exists = applied or row.get("status_rank") is not None
        return applied, exists

    async def record_event(
        self, message_id: str, occurred_at: datetime, event_id: str, status: Status,
        attempt: int, reason: str | None, source: str, applied: bool,
    ) -> None:
        await self._run("event_insert", (
            message_id, _ts(occurred_at), event_id, status.value, attempt, reason, source, applied,
        ))

    async def events(self, message_id: str) -> list[dict[str, Any]]:
        return await self._run("events_get", (message_id,))

    async def record_attempt(self, message_id: str, a: AttemptRecord) -> None:
        await self._run("attempt_insert", (
            message_id, a.attempt_no, a.provider_id, a.provider_message_id, a.outcome,
            a.normalized_error, a.error_code, _ts(a.started_at), _ts(a.completed_at),
        ))
        if a.provider_message_id:
            await self._run("provider_index_insert", (
                a.provider_id, a.provider_message_id, message_id, a.attempt_no,
            ))

    async def attempts(self, message_id: str) -> list[dict[str, Any]]:
        return await self._run("attempts_get", (message_id,))

    async def message_for_provider_id(
        self, provider_id: str, provider_message_id: str
    ) -> dict[str, Any] | None:
        rows = await self._run("provider_index_get", (provider_id, provider_message_id))
        return rows[0] if rows else None

    async def receipt_seen(
        self, provider_id: str, provider_event_id: str, message_id: str, status: Status,
        now: datetime,
    ) -> bool:
        """Record a receipt id; True when it was already recorded (a duplicate)."""
        rows = await self._run("receipt_dedup", (
            provider_id, provider_event_id, message_id, status.value, now,
        ))
        return not (rows and rows[0].get("[applied]"))

    # ------------------------------------------------------------------------- templates

    async def put_template(self, values: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        rows = await self._run("template_insert", (
            values["tenant_id"], values["template_id"], values["version"], values["channel"],
            values["subject"], values["body"], list(values["variables"]),
            values.get("description"), values["checksum"], values["created_at"],
        ))
        row = rows[0] if rows else {}
        return bool(row.get("[applied]")), (None if row.get("[applied]") else row)

    async def get_template(
        self, tenant_id: str, template_id: str, version: int
    ) -> dict[str, Any] | None:
        rows = await self._run("template_get", (tenant_id, template_id, version))
        return rows[0] if rows else None

    async def latest_template_version(self, tenant_id: str, template_id: str) -> int:
        rows = await self._run("template_latest", (tenant_id, template_id))
        return int(rows[0]["version"]) if rows else 0

    async def latest_template(self, tenant_id: str, template_id: str) -> dict[str, Any] | None:
        """The highest version of a template, or None."""
        rows = await self._run("template_latest_row", (tenant_id, template_id))
        return rows[0] if rows else None

    # ---------------------------------------------------------------------------- health

    async def ping(self) -> None:
        """One cheap read at the configured consistency; raises when Cassandra cannot answer."""
        await self._run("ping", ())


def date_of(d: datetime) -> date:
    return d.astimezone(UTC).date()


_STATEMENTS: dict[str, str] = {
    "idem_get": "SELECT * FROM idempotency WHERE tenant_id = ? AND idempotency_key = ?",
    "idem_delete": "DELETE FROM idempotency WHERE tenant_id = ? AND idempotency_key = ?",
    "outbox_add": "INSERT INTO outbox_pending (shard, created_at, tenant_id, idempotency_key) "
    "VALUES (?, ?, ?, ?)",
    "outbox_remove": "DELETE FROM outbox_pending WHERE shard = ? AND created_at = ? "
    "AND tenant_id = ? AND idempotency_key = ?",
    "outbox_due": "SELECT * FROM outbox_pending WHERE shard = ? AND created_at < ? LIMIT 500",
    "msg_insert": "INSERT INTO messages (message_id, tenant_id, channel, tier, category, "
    "recipient_hash, recipient_masked, template_id, template_version, idempotency_key, "
    "ordering_key, status_webhook, status, status_rank, attempt, scheduled_at, expires_at, "
    "accepted_at, created_at, updated_at) VALUES "
    "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "tenant_day_insert": "INSERT INTO messages_by_tenant_day (tenant_id, day, created_at, "
    "message_id, channel, tier, category) VALUES (?, ?, ?, ?, ?, ?, ?)",
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
    "attempt_insert": "INSERT INTO attempts (message_id, attempt_no, provider_id, "
    "provider_message_id, outcome, normalized_error, error_code, started_at, completed_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "attempts_get": "SELECT * FROM attempts WHERE message_id = ?",
    "provider_index_insert": "INSERT INTO provider_messages (provider_id, provider_message_id, "
    "message_id, attempt_no) VALUES (?, ?, ?, ?)",
    "provider_index_get": "SELECT * FROM provider_messages WHERE provider_id = ? "
    "AND provider_message_id = ?",
    "receipt_dedup": "INSERT INTO receipts_dedup (provider_id, provider_event_id, message_id, "
    "status, received_at) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS",
    "template_insert": "INSERT INTO templates (tenant_id, template_id, version, channel, subject, "
    "body, variables, description, checksum, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "IF NOT EXISTS",
    "template_get": "SELECT * FROM templates WHERE tenant_id = ? AND template_id = ? "
    "AND version = ?",
    "template_latest": "SELECT version FROM templates WHERE tenant_id = ? AND template_id = ? "
    "LIMIT 1",
    "template_latest_row": "SELECT * FROM templates WHERE tenant_id = ? AND template_id = ? "
    "LIMIT 1",
    "ping": "SELECT release_version FROM system.local",
}
