"""Cassandra: the operational source of truth (messages, attempts, idempotency, templates,
recipient preference state, device tokens) and the operators' query tables
(``ops/queries.md``: ``failures_by_tier_day``, ``provider_outcomes_by_hour``).

All statements are prepared once; every call is asynchronous (the driver's own I/O thread
resolves an asyncio future), so a Bytewax worker or the API loop can run many at once.
Status transitions are read-then-write with write times ordered by ``status_rank``
(``schemas/status.py``, :func:`rank_write_time`), no Paxos round per message; recipient
state changes are compare-and-set on ``version`` (every write to ``recipient_preferences`` is
a lightweight transaction, so a read at ``LOCAL_QUORUM`` after it returns sees it).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from cassandra import ConsistencyLevel, InvalidRequest, WriteTimeout
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    ResponseFuture,
    Session,
)
from cassandra.policies import DCAwareRoundRobinPolicy, RetryPolicy, WriteType
from cassandra.query import BatchStatement, BatchType, PreparedStatement, dict_factory

from notiflow.adapters.cassandra_coalesce import CassandraCoalescer, KeyedRead
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import AttemptRecord, MessageSnapshot
from notiflow.schemas.preferences import OptOut, PreferenceState, QuietWindow, Suppression
from notiflow.schemas.status import rank, write_offset_us
from notiflow.settings import CassandraSecurity, Settings, TlsFiles

log = logging.getLogger(__name__)

Write = tuple[str, tuple[Any, ...]]
"""A prepared statement's name and its parameters (see :meth:`CassandraStore.write_all`)."""
logging.getLogger("cassandra").setLevel(logging.ERROR)

OUTBOX_SHARDS = 16
OUTBOX_BUCKET_MS = 10_000
"""Width of an ``outbox_buckets`` time bucket."""
OUTBOX_READ_LIMIT = 500
MAX_STATE_RACES = 16
"""Compare-and-set attempts on one recipient's state before :class:`StateContention`."""
MAX_TTL_S = 630_720_000
"""Cassandra refuses a TTL over 20 years."""
LAST_EXPIRY = datetime(2038, 1, 19, tzinfo=UTC)
"""Cassandra refuses cells expiring after 2038-01-19 (its 32-bit expiration time)."""
STATE_READ_CONCURRENCY = 256
OPERATOR_SHARDS = 32
"""Shards of each ``failures_by_tier_day`` day and ``provider_outcomes_by_hour`` hour
(``shard = crc32(message_id) % 32``); the queries in ``ops/queries.md`` list all of them."""
FAILURE_STATUSES = frozenset({Status.FAILED, Status.EXPIRED, Status.BOUNCED})
"""Statuses indexed in ``failures_by_tier_day``."""
LIST_MAX_SCAN = 1000
"""Index rows one :meth:`CassandraStore.recent_messages` call reads at most (bounds a request
whose status filter matches little); the page then ends early with a cursor."""
LIST_JOIN_CONCURRENCY = 64

StateChange = Callable[[PreferenceState], PreferenceState | None]
"""Given the current state (version 0 when none is stored), the wanted state (its
``version`` and ``updated_at`` are set by the store), or None when nothing changes."""


def _paxos_timeout(exc: WriteTimeout) -> None:
    """Re-raise ``exc`` unless it is a Paxos round that timed out (``write_type`` CAS: the
    outcome is unknown, and a later serial read settles it)."""
    if exc.write_type != WriteType.CAS:
        raise exc


class StateContention(RuntimeError):
    """Too many concurrent writers on one recipient's state; the caller may retry."""


def tls_context(security: TlsFiles) -> ssl.SSLContext:
    """A client context verifying servers against ``ca_file`` (or the system's trust store),
    presenting ``cert_file`` when set, checking hostnames when ``check_hostname``."""
    ctx = ssl.create_default_context(
        cafile=str(security.ca_file) if security.ca_file is not None else None)
    ctx.check_hostname = security.check_hostname
    if security.cert_file is not None and security.key_file is not None:
        password = security.key_password.get_secret_value() if security.key_password else None
        ctx.load_cert_chain(security.cert_file, security.key_file, password)
    return ctx


def cluster_security(security: CassandraSecurity) -> dict[str, Any]:
    """``Cluster`` keyword arguments of ``security``: ``ssl_context`` (TLS) and
    ``auth_provider`` (a ``PlainTextAuthProvider``); empty when neither is configured. With
    ``check_hostname`` the driver checks each node's certificate against the node's address
    (its ``rpc_address``, usually an IP)."""
    options: dict[str, Any] = {}
    if security.tls:
        options["ssl_context"] = tls_context(security)
    if security.username is not None and security.password is not None:
        options["auth_provider"] = PlainTextAuthProvider(
            username=security.username, password=security.password.get_secret_value())
    return options


def connect(
    settings: Settings, keyspace: str | None = "", connect_timeout: float = 5.0
) -> tuple[Cluster, Session]:
    """Open a cluster connection, with the transport security of
    :func:`cluster_security`; ``keyspace=""`` means the configured keyspace. Every Cassandra
    session of notiflow comes from here."""
    profile = ExecutionProfile(
        load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=settings.cassandra_dc),
        retry_policy=RetryPolicy(),
        consistency_level=ConsistencyLevel.LOCAL_QUORUM,
        serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
        request_timeout=10.0,
        row_factory=dict_factory,
    )
    cluster = Cluster(
        list(settings.cassandra_hosts),
        port=settings.cassandra_port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},  # type: ignore[has-type]  # untyped sentinel
        connect_timeout=connect_timeout,
        control_connection_timeout=connect_timeout,
        protocol_version=5,
        **cluster_security(settings.cassandra_security),
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
    """One page of :meth:`CassandraStore.recent_messages`: ``messages`` rows, newest
    acceptance first, and ``next``, where the following page starts (None when the range is
    exhausted)."""

    messages: list[dict[str, Any]]
    next: Cursor | None


def operator_shard(message_id: str) -> int:
    """The shard of a message's rows in the operators' query tables."""
    return zlib.crc32(message_id.encode()) % OPERATOR_SHARDS


def hour_of(d: datetime) -> datetime:
    """``d`` in UTC truncated to the hour (the ``provider_outcomes_by_hour`` bucket)."""
    return d.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


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


@dataclass(frozen=True, slots=True)
class OutboxSlot:
    """Where an outbox row lives: its 10-second ``bucket`` (of when it was written) and its
    ``shard``; ``bucket`` None names the legacy ``outbox_pending`` table."""

    bucket: int | None
    shard: int

    @staticmethod
    def bucket_of(at: datetime) -> int:
        return int(at.timestamp() * 1000) // OUTBOX_BUCKET_MS


def to_ms(d: datetime) -> datetime:
    """``d`` in UTC truncated to milliseconds (Cassandra's timestamp precision)."""
    d = d.astimezone(UTC)
    return d.replace(microsecond=d.microsecond // 1000 * 1000)


def created_write_time(snap: MessageSnapshot) -> int:
    """Write time (micro-seconds) of a message row's creation: its acceptance time."""
    return int(snap.accepted_at.timestamp() * 1_000_000)


def rank_write_time(head: dict[str, Any], r: int) -> int | None:
    """Write time of a transition to rank ``r``: the row's creation write time +
    :func:`write_offset_us` of ``r``, so a higher rank always carries a later time, at most
    0.13 s after acceptance. None when the row's status cells carry another time (written by
    compare-and-set: an older release, a DLQ replay's re-queue) or a rank has no offset: such
    rows keep using compare-and-set."""
    created, written = head.get("created_wt"), head.get("status_wt")
    offset, current = write_offset_us(r), write_offset_us(head.get("status_rank") or 0)
    if created is None or written is None or offset is None or current is None:
        return None
    if written not in (created, created + current):
        return None
    return int(created) + offset


def blank_state(tenant_id: str, recipient_hash: str, now: datetime) -> PreferenceState:
    """Version 0: what a recipient without a stored state is treated as."""
    return PreferenceState(tenant_id=tenant_id, recipient_hash=recipient_hash, version=0,
                           updated_at=to_ms(now))


def opt_out_text(o: OptOut) -> str:
    """``{channel}/{category}`` as stored in ``recipient_preferences.opt_outs``."""
    return f"{o.channel}/{o.category}"


def state_from_row(row: dict[str, Any]) -> PreferenceState:
    """A ``recipient_preferences`` row as the wire state."""
    start, end = row.get("quiet_start"), row.get("quiet_end")
    quiet = (QuietWindow(start=time.fromisoformat(start), end=time.fromisoformat(end))
             if start and end else None)
    opt_outs = []
    for text in row.get("opt_outs") or ():
        channel, _, category = text.partition("/")
        opt_outs.append(OptOut.model_validate({"channel": channel, "category": category}))
    updated_at = utc(row.get("updated_at")) or datetime.fromtimestamp(0, UTC)
    return PreferenceState(
        tenant_id=row["tenant_id"], recipient_hash=row["recipient_hash"],
        version=int(row.get("version") or 0), updated_at=updated_at,
        timezone=row.get("timezone"), quiet_hours=quiet, opt_outs=tuple(opt_outs),
        suppressed=row.get("suppressed"),
    )


def state_columns(state: PreferenceState) -> tuple[Any, ...]:
    """``(version, timezone, quiet_start, quiet_end, opt_outs, suppressed, updated_at)``."""
    q = state.quiet_hours
    return (
        state.version, state.timezone,
        q.start.isoformat() if q else None, q.end.isoformat() if q else None,
        [opt_out_text(o) for o in state.opt_outs] or None, state.suppressed,
        state.updated_at,
    )


class CassandraStore:
    """Every read and write notiflow makes to Cassandra."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.settings = settings
        self._idem_ttl = int(settings.idempotency_ttl.total_seconds())
        self._stmts: dict[str, PreparedStatement] = {}
        self._coalescer: CassandraCoalescer | None = None
        self._keyed: dict[str, KeyedRead] = {}
        for name, cql in _STATEMENTS.items():
            self._stmts[name] = session.prepare(cql)
        self._stmts["reserve"] = session.prepare(
            "INSERT INTO idempotency (tenant_id, idempotency_key, request_hash, message_id, "
            "state, topic, payload, created_at) VALUES (?, ?, ?, ?, 'PENDING', ?, ?, ?) "
            f"IF NOT EXISTS USING TTL {self._idem_ttl}"
        )
        self._stmts["reservation_put"] = session.prepare(
            "INSERT INTO idempotency (tenant_id, idempotency_key, request_hash, message_id, "
            "state, topic, payload, created_at) VALUES (?, ?, ?, ?, 'PENDING', ?, ?, ?) "
            f"USING TTL {self._idem_ttl}"
        )
        serial = session.prepare(_STATEMENTS["pref_get"])
        serial.consistency_level = ConsistencyLevel.LOCAL_SERIAL
        self._stmts["pref_get_serial"] = serial
        self._stmts["idem_accept"] = session.prepare(
            "UPDATE idempotency USING TTL " + str(self._idem_ttl) + " SET state = 'ACCEPTED', "
            "response = ? WHERE tenant_id = ? AND idempotency_key = ?"
        )
        for name, cql in {**_OPERATOR_STATEMENTS, **_TRACE_STATEMENTS}.items():
            try:
                self._stmts[name] = session.prepare(cql)
            except InvalidRequest as exc:
                # new code before its migration (rolling deploy): skip the index writes
                log.error("operator query tables or columns missing (%s): run "
                          "`notiflow stack migrate`", exc)

    def _run(self, name: str, params: Sequence[Any]) -> asyncio.Future[list[dict[str, Any]]]:
        return aio(self.session.execute_async(self._stmts[name], params))

    def coalesce(self, *, max_keys: int, max_rows: int) -> CassandraStore:
        """From now on :meth:`head`, :meth:`receipt_record`, :meth:`message_for_provider_id`
        and :meth:`write_all` calls made in one event-loop turn share requests
        (:mod:`notiflow.adapters.cassandra_coalesce`); returns this store."""
        def keyed(name: str, column: str, also: str = "") -> KeyedRead:
            """``name``'s statement for many values of its last key ``column``."""
            cql = _STATEMENTS[name].replace("SELECT ", f"SELECT {also}", 1)
            return KeyedRead(self.session.prepare(
                cql.replace(f"{column} = ?", f"{column} IN ?")), column)

        self._keyed = {
            "msg_head": keyed("msg_head", "message_id", "message_id, "),
            "receipt_get": keyed("receipt_get", "provider_event_id", "provider_event_id, "),
            "provider_index_get": keyed("provider_index_get", "provider_message_id"),
            "idem_get": keyed("idem_get", "idempotency_key"),
        }
        self._coalescer = CassandraCoalescer(self.session, aio, max_keys=max_keys,
                                             max_rows=max_rows)
        return self

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

    @staticmethod
    def reservation_write(tenant_id: str, key: str, request_hash: str, message_id: str,
                          topic: str, payload: str, created_at: datetime) -> Write:
        """The ``PENDING`` reservation of :meth:`reserve`, written plainly (no Paxos round),
        for :meth:`write_all`: for a key whose requests something else serialises (an
        idempotency fence, or a key nobody else can know)."""
        return ("reservation_put",
                (tenant_id, key, request_hash, message_id, topic, payload, created_at))

    async def get_reservation(self, tenant_id: str, key: str) -> dict[str, Any] | None:
        """The key's reservation row (``IN`` reads of concurrent callers when coalescing)."""
        if self._coalescer is not None:
            return await self._coalescer.read(self._keyed["idem_get"], (tenant_id,), key)
        rows = await self._run("idem_get", (tenant_id, key))
        return rows[0] if rows else None

    async def settle_reservation(self, tenant_id: str, key: str, response: str,
                                 slot: OutboxSlot, created_at: datetime) -> None:
        """Mark the key ``ACCEPTED`` and drop its outbox row, in one request."""
        await self.write_all([("idem_accept", (response, tenant_id, key)),
                              self._outbox_remove(slot, created_at, tenant_id, key)])

    async def drop_reservation(self, tenant_id: str, key: str) -> None:
        await self._run("idem_delete", (tenant_id, key))

    async def outbox_add(self, slot: OutboxSlot, created_at: datetime, tenant_id: str,
                         key: str) -> None:
        await self.write_all([self.outbox_write(slot, created_at, tenant_id, key)])

    @staticmethod
    def outbox_write(slot: OutboxSlot, created_at: datetime, tenant_id: str, key: str) -> Write:
        """The outbox row of :meth:`outbox_add` (for :meth:`write_all`)."""
        return ("outbox_add", (slot.bucket, slot.shard, created_at, tenant_id, key))

    @staticmethod
    def _outbox_remove(slot: OutboxSlot, created_at: datetime, tenant_id: str,
                       key: str) -> Write:
        if slot.bucket is None:
            return ("outbox_legacy_remove", (slot.shard, created_at, tenant_id, key))
        return ("outbox_remove", (slot.bucket, slot.shard, created_at, tenant_id, key))

    async def outbox_remove(self, slot: OutboxSlot, created_at: datetime, tenant_id: str,
                            key: str) -> None:
        await self.write_all([self._outbox_remove(slot, created_at, tenant_id, key)])

    async def outbox_rows(self, slot: OutboxSlot) -> list[dict[str, Any]]:
        """Up to :data:`OUTBOX_READ_LIMIT` outbox rows of one bucket and shard, oldest first
        (``slot.bucket`` None: the legacy ``outbox_pending`` shard)."""
        if slot.bucket is None:
            return await self._run("outbox_legacy_rows", (slot.shard,))
        return await self._run("outbox_rows", (slot.bucket, slot.shard))

    async def outbox_cursor(self, shard: int, start: int) -> int:
        """The first bucket of ``shard`` that may still hold rows; ``start`` when the shard
        has no cursor yet (the first sweeper to ask sets it)."""
        rows = await self._run("outbox_cursor_init", (shard, start))
        row = rows[0] if rows else {}
        bucket = row.get("bucket")
        if row.get("[applied]", True) or bucket is None:
            return start
        return int(bucket)

    async def outbox_advance(self, shard: int, bucket: int) -> None:
        """Move ``shard``'s cursor to ``bucket`` (the buckets before it are empty)."""
        await self._run("outbox_cursor_set", (bucket, shard))

    async def outbox_park(self, slot: OutboxSlot, created_at: datetime, tenant_id: str,
                          key: str, reason: str, now: datetime) -> None:
        """Move an outbox row that cannot be published to ``outbox_parked``."""
        await self.write_all([
            ("outbox_park", (tenant_id, key, created_at, reason, now)),
            self._outbox_remove(slot, created_at, tenant_id, key)])

    # -------------------------------------------------------------------------- messages

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
            await self.write_all(also)
            return False
        await self.write_all([*also, *self.creation_writes(message_id, snap, status, now,
                                                           source)])
        return True

    def creation_writes(self, message_id: str, snap: MessageSnapshot, status: Status,
                        now: datetime, source: str) -> list[Write]:
        """The writes of :meth:`create_message` (for :meth:`write_all`)."""
        values = (
            message_id, snap.tenant_id, snap.channel.value, snap.tier.value,
            snap.category.value, snap.recipient_hash, snap.recipient_masked, snap.template_id,
            snap.template_version, snap.idempotency_key, snap.ordering_key, snap.status_webhook,
            status.value, rank(status), 0, _ts(snap.scheduled_at), _ts(snap.expires_at),
            _ts(snap.accepted_at), now, now,
        )
        ttl = self.row_ttl(snap, now)
        return [
            ("msg_insert", (*values, created_write_time(snap), ttl)),
            ("tenant_day_insert", (
                snap.tenant_id, date_of(snap.accepted_at), _ts(snap.accepted_at),
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
        return min(int(ttl.total_seconds()), MAX_TTL_S,
                   int((LAST_EXPIRY - now).total_seconds()))

    @staticmethod
    def created_head(snap: MessageSnapshot, status: Status, now: datetime) -> dict[str, Any]:
        """The :meth:`head` of a row :meth:`create_message` just wrote (no read needed)."""
        at = created_write_time(snap)
        return {"status_rank": rank(status), "status": status.value, "attempt": 0,
                "reason": None, "updated_at": now, "provider_id": None,
                "tier": snap.tier.value, "tenant_id": snap.tenant_id,
                "channel": snap.channel.value, "category": snap.category.value,
                "created_wt": at, "status_wt": at}

    async def head(self, message_id: str) -> dict[str, Any] | None:
        """The message row's status columns and write times (for :meth:`transition`)."""
        if self._coalescer is not None:
            return await self._coalescer.read(self._keyed["msg_head"], (), message_id)
        rows = await self._run("msg_head", (message_id,))
        return rows[0] if rows else None

    def heads(self, message_ids: Sequence[str]) -> Awaitable[list[dict[str, Any] | None]]:
        """:meth:`head` of each id, in order (``IN`` reads of ``max_keys`` ids when
        coalescing)."""
        return self._read_each("msg_head", [((), m) for m in message_ids], self.head)

    def _read_each(self, name: str, keys: Sequence[tuple[tuple[Any, ...], Any]],
                   one: Callable[..., Awaitable[dict[str, Any] | None]],
                   ) -> Awaitable[list[dict[str, Any] | None]]:
        """The row of each ``(prefix, key)`` of keyed read ``name``, in order: through the
        coalescer when there is one, else ``one(*prefix, key)`` each."""
        if self._coalescer is not None:
            query = self._keyed[name]
            return asyncio.gather(*(self._coalescer.read(query, p, k) for p, k in keys))
        return asyncio.gather(*(one(*p, k) for p, k in keys))

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
        next_attempt_at: datetime | None = None, *, head: dict[str, Any] | None = None,
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
                await self.write_all(then(applied))
            return applied, exists
        applied, writes = planned
        if then is not None:
            writes += then(applied)
        await self.write_all(writes)
        return applied, True

    def planned_transition(
        self, message_id: str, status: Status, attempt: int, reason: str | None,
        now: datetime, provider_id: str | None = None, provider_message_id: str | None = None,
        next_attempt_at: datetime | None = None, *, head: dict[str, Any],
    ) -> tuple[bool, list[Write]] | None:
        """Whether :meth:`transition` from the existing row ``head`` applies, and its writes
        (nothing is sent); None when the row keeps the compare-and-set path."""
        r = rank(status, attempt)
        at = rank_write_time(head, r)
        if at is None:
            return None
        current = head.get("status_rank")
        applied = current is None or current < r
        writes: list[Write] = []
        if applied:
            writes.append(("msg_advance", (
                at, status.value, r, reason, attempt, now, provider_id, provider_message_id,
                _ts(next_attempt_at), message_id,
            )))
        if status in FAILURE_STATUSES and (applied or current == r):
            failure = self._failure_write(message_id, status, r, attempt, reason, provider_id,
                                          to_ms(now) if applied else None, head)
            writes += [failure] if failure else []
        return applied, writes

    async def _cas_transition(
        self, message_id: str, status: Status, attempt: int, reason: str | None,
        now: datetime, provider_id: str | None, provider_message_id: str | None,
        next_attempt_at: datetime | None, head: dict[str, Any],
    ) -> tuple[bool, bool]:
        """The compare-and-set transition (``head``: the row as read before it)."""
        r = rank(status, attempt)
        rows = await self._run("msg_transition", (
            status.value, r, reason, attempt, now, provider_id, provider_message_id,
            _ts(next_attempt_at), message_id, r,
        ))
        row = rows[0] if rows else {}
        applied = bool(row.get("[applied]"))
        exists = applied or row.get("status_rank") is not None
        if status in FAILURE_STATUSES and (applied or row.get("status_rank") == r):
            failure = self._failure_write(message_id, status, r, attempt, reason, provider_id,
                                          to_ms(now) if applied else None, head)
            if failure is not None:
                await self._run(*failure)
        return applied, exists

    def _failure_write(
        self, message_id: str, status: Status, r: int, attempt: int, reason: str | None,
        provider_id: str | None, failed_at: datetime | None, msg: dict[str, Any] | None,
    ) -> Write | None:
        """The ``failures_by_tier_day`` row of a transition into a failure status.
        ``failed_at`` None: a replayed transition that was already applied; the row is
        rewritten from the message row (same key, its ``updated_at``) while the message is
        still in that status, so replays never add a second row. ``msg``: the message row
        as it was before the transition."""
        if "failure_insert" not in self._stmts or msg is None or not msg.get("tier"):
            return None
        if failed_at is None:
            if msg.get("status_rank") != r or msg.get("updated_at") is None:
                return None
            failed_at = utc(msg["updated_at"])
            assert failed_at is not None
            attempt, reason = int(msg.get("attempt") or 0), msg.get("reason")
            provider_id = msg.get("provider_id")
        return ("failure_insert", (
            msg["tier"], date_of(failed_at), operator_shard(message_id), failed_at, message_id,
            status.value, reason, msg.get("tenant_id"), msg.get("channel"),
            msg.get("category"), attempt, provider_id or msg.get("provider_id"),
        ))

    def event_write(
        self, message_id: str, occurred_at: datetime, event_id: str, status: Status,
        attempt: int, reason: str | None, source: str, applied: bool,
    ) -> Write:
        """The status-history row (for :meth:`write_all`)."""
        return ("event_insert", (message_id, _ts(occurred_at), event_id, status.value, attempt,
                                 reason, source, applied))

    async def write_all(self, writes: Sequence[Write]) -> None:
        """Idempotent upserts as one request (an unlogged batch when there are several): the
        reconciler writes a message's history, attempt and index rows together, and the
        driver's per-request cost was its largest CPU item (``notiflow bench throughput``)."""
        if not writes:
            return
        if self._coalescer is not None:
            await self._coalescer.write([(self._stmts[name], params) for name, params in writes])
            return
        if len(writes) == 1:
            await self._run(*writes[0])
            return
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for name, params in writes:
            batch.add(self._stmts[name], params)
        await aio(self.session.execute_async(batch))

    def write_each(self, groups: Sequence[Sequence[Write]]) -> Awaitable[list[None]]:
        """:meth:`write_all` of every group at once; resolves when all are acknowledged
        (when coalescing, a group's rows share one batch unless they alone exceed
        ``max_rows``)."""
        if self._coalescer is not None:
            return asyncio.gather(*(self._coalescer.write([(self._stmts[n], p) for n, p in g])
                                    for g in groups if g))
        return asyncio.gather(*(self.write_all(g) for g in groups))

    async def events(self, message_id: str) -> list[dict[str, Any]]:
        return await self._run("events_get", (message_id,))

    async def record_attempt(self, message_id: str, a: AttemptRecord,
                             traceparent: str | None = None) -> None:
        await self.write_all(self.attempt_writes(message_id, a, traceparent))

    def attempt_writes(self, message_id: str, a: AttemptRecord,
                       traceparent: str | None = None) -> list[Write]:
        """The attempt row, its ``provider_outcomes_by_hour`` row (at ``completed_at``) and
        the provider message index (with the send's ``traceparent``, for receipts that do not
        echo it); all upserts keyed by the attempt (replay-safe)."""
        writes: list[Write] = [("attempt_insert", (
            message_id, a.attempt_no, a.provider_id, a.provider_message_id, a.outcome,
            a.normalized_error, a.error_code, _ts(a.started_at), _ts(a.completed_at),
        ))]
        if "outcome_insert" in self._stmts:
            latency = round((a.completed_at - a.started_at).total_seconds() * 1000)
            at = to_ms(a.completed_at)
            writes.append(("outcome_insert", (
                a.provider_id, hour_of(at), operator_shard(message_id), at, message_id,
                f"attempt:{a.attempt_no}", "attempt", a.outcome, a.normalized_error,
                a.error_code, max(0, latency), a.provider_message_id,
            )))
        if a.provider_message_id:
            key = (a.provider_id, a.provider_message_id, message_id, a.attempt_no)
            if traceparent and "provider_index_insert_traced" in self._stmts:
                writes.append(("provider_index_insert_traced", (*key, traceparent)))
            else:
                writes.append(("provider_index_insert", key))
        return writes

    async def attempts(self, message_id: str) -> list[dict[str, Any]]:
        return await self._run("attempts_get", (message_id,))

    async def message_for_provider_id(
        self, provider_id: str, provider_message_id: str
    ) -> dict[str, Any] | None:
        if self._coalescer is not None:
            return await self._coalescer.read(self._keyed["provider_index_get"],
                                              (provider_id,), provider_message_id)
        rows = await self._run("provider_index_get", (provider_id, provider_message_id))
        return rows[0] if rows else None

    async def receipt_record(self, provider_id: str,
                             provider_event_id: str) -> dict[str, Any] | None:
        """The ``receipts_dedup`` row of a receipt id, None when it is new."""
        if self._coalescer is not None:
            return await self._coalescer.read(self._keyed["receipt_get"], (provider_id,),
                                              provider_event_id)
        rows = await self._run("receipt_get", (provider_id, provider_event_id))
        return rows[0] if rows else None

    def receipt_records(self, keys: Sequence[tuple[str, str]]
                        ) -> Awaitable[list[dict[str, Any] | None]]:
        """:meth:`receipt_record` of each ``(provider_id, provider_event_id)``, in order."""
        return self._read_each("receipt_get", [((p,), e) for p, e in keys],
                               self.receipt_record)

    def receipt_writes(
        self, provider_id: str, provider_event_id: str, message_id: str, status: Status,
        now: datetime, seen: dict[str, Any] | None,
    ) -> list[Write]:
        """A new receipt id is recorded; either way the receipt's
        ``provider_outcomes_by_hour`` row is (re)written at its first ``received_at``, so a
        replay after a crash between the writes completes it. A read, then plain writes (no
        Paxos round): two copies of one receipt processed at the same instant are both
        taken as new, and every write they cause is keyed by the receipt, so the second
        rewrites the first's rows."""
        received = utc(seen.get("received_at")) if seen is not None else to_ms(now)
        writes: list[Write] = []
        if seen is None:
            writes.append(("receipt_put", (provider_id, provider_event_id, message_id,
                                           status.value, received)))
        if "outcome_insert" in self._stmts and received is not None:
            writes.append(("outcome_insert", (
                provider_id, hour_of(received), operator_shard(message_id), received,
                message_id, f"receipt:{provider_event_id}", "receipt", status.value, None, None,
                None, None,
            )))
        return writes

    # ----------------------------------------------------------- a tenant's recent messages

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
        found: list[dict[str, Any]] = []
        scanned = 0
        sem = asyncio.Semaphore(LIST_JOIN_CONCURRENCY)

        async def joined(message_id: str) -> dict[str, Any] | None:
            async with sem:
                return await self.get_message(message_id)

        while day >= first_day:
            want = min(max(limit - len(found), 50), 500, max_scan - scanned)
            same_day = position is not None and date_of(position.created_at) == day
            index = await self._tenant_day_page(tenant_id, day, since,
                                                position if same_day else None, want)
            rows = await asyncio.gather(*(joined(i["message_id"]) for i in index))
            for i, row in zip(index, rows, strict=True):
                scanned += 1
                position = Cursor(utc(i["created_at"]) or since, i["message_id"])
                if row is None or row.get("tenant_id") != tenant_id:
                    continue
                if status is not None and row.get("status") != status.value:
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
                               after: Cursor | None, n: int) -> list[dict[str, Any]]:
        """Up to ``n`` index rows of one day partition at or after ``since``, strictly after
        ``after`` in the clustering order (``created_at DESC, message_id ASC``)."""
        if after is None:
            return await self._run("tenant_day_page", (tenant_id, day, since, n))
        ties = await self._run("tenant_day_ties", (tenant_id, day, after.created_at,
                                                   after.message_id, n))
        if len(ties) >= n:
            return ties
        older = await self._run("tenant_day_older", (tenant_id, day, after.created_at, since,
                                                     n - len(ties)))
        return ties + older

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

    # ------------------------------------------------------------ recipient state, devices

    async def get_state(self, tenant_id: str, recipient_hash: str, *,
                        serial: bool = False) -> PreferenceState | None:
        """The stored state (``LOCAL_QUORUM``; ``serial`` also completes an in-flight
        transaction first), or None."""
        rows = await self._run("pref_get_serial" if serial else "pref_get",
                               (tenant_id, recipient_hash))
        return state_from_row(rows[0]) if rows else None

    async def get_states(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], PreferenceState]:
        """States of many ``(tenant_id, recipient_hash)`` at once (concurrent single-partition
        reads); recipients without a stored state are absent from the result."""
        wanted = list(dict.fromkeys(keys))
        limit = asyncio.Semaphore(STATE_READ_CONCURRENCY)

        async def one(key: tuple[str, str]) -> PreferenceState | None:
            async with limit:
                return await self.get_state(*key)

        found = await asyncio.gather(*(one(k) for k in wanted))
        return {k: st for k, st in zip(wanted, found, strict=True) if st is not None}

    async def change_state(self, tenant_id: str, recipient_hash: str, change: StateChange,
                           now: datetime | None = None) -> tuple[PreferenceState | None, bool]:
        """Read-modify-write of one recipient's state: ``version + 1`` written with a
        lightweight transaction on the version read, re-read and retried on contention.
        Returns (the state now stored, whether this call wrote it); raises
        :class:`StateContention` after :data:`MAX_STATE_RACES` lost races. A transaction
        that timed out in Paxos (contention on a replicated partition; the outcome is
        unknown) counts as a race, and so does a serial read that timed out: the next serial
        read tells whether it was written. When it was, and another write came before that
        read, the change is written once more (as a client's retry of a 503 would)."""
        stamp = to_ms(now or datetime.now(UTC))
        current = await self.get_state(tenant_id, recipient_hash)
        for _ in range(MAX_STATE_RACES):
            base = current or blank_state(tenant_id, recipient_hash, stamp)
            wanted = change(base)
            if wanted is None:
                return current, False
            new = PreferenceState.model_validate({
                **wanted.model_dump(), "tenant_id": tenant_id, "recipient_hash": recipient_hash,
                "version": base.version + 1, "updated_at": max(stamp, base.updated_at),
            })
            try:
                if current is None:
                    rows = await self._run("pref_insert",
                                           (tenant_id, recipient_hash, *state_columns(new)))
                else:
                    rows = await self._run("pref_update", (
                        *state_columns(new), tenant_id, recipient_hash, current.version))
            except WriteTimeout as exc:
                _paxos_timeout(exc)
                rows = []
            if rows and rows[0].get("[applied]"):
                return new, True
            try:
                current = await self.get_state(tenant_id, recipient_hash, serial=True)
            except WriteTimeout as exc:
                _paxos_timeout(exc)
                continue
            if current is not None and current == new:
                return new, True
        raise StateContention(f"state of {tenant_id}/{recipient_hash} keeps changing")

    async def suppress(self, tenant_id: str, recipient_hash: str, reason: Suppression,
                       now: datetime | None = None) -> PreferenceState:
        """Mark an address or device token dead (``suppressed = reason``, version bumped);
        a no-op returning the stored state when it already carries that reason."""
        def change(st: PreferenceState) -> PreferenceState | None:
            return None if st.suppressed == reason else st.model_copy(
                update={"suppressed": reason})

        state, _ = await self.change_state(tenant_id, recipient_hash, change, now)
        if state is None:
            raise RuntimeError("suppression produced no state")
        return state

    async def unsuppress(self, tenant_id: str, recipient_hash: str,
                         now: datetime | None = None) -> PreferenceState | None:
        """Clear a suppression (a device token registered again); the stored state, None
        when there is none."""
        def change(st: PreferenceState) -> PreferenceState | None:
            return None if st.suppressed is None else st.model_copy(update={"suppressed": None})

        state, _ = await self.change_state(tenant_id, recipient_hash, change, now)
        return state

    async def get_device(self, tenant_id: str, owner_hash: str,
                         device_token: str) -> dict[str, Any] | None:
        rows = await self._run("device_get", (tenant_id, owner_hash, device_token))
        return rows[0] if rows else None

    async def activate_device(self, tenant_id: str, owner_hash: str, device_token: str,
                              platform: str, now: datetime, token_hash: str) -> None:
        """Register or reactivate a device token of a recipient (``active = true``) and
        record the recipient as an owner of ``token_hash`` (the token's recipient hash)."""
        await self.write_all([
            ("device_activate", (platform, now, tenant_id, owner_hash, device_token)),
            ("device_owner_put", (tenant_id, token_hash, owner_hash, device_token, platform,
                                  now)),
        ])

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str,
                               now: datetime) -> int:
        """``active = false`` with ``reason`` on every owner's row of the token whose
        recipient hash is ``token_hash``; returns how many rows (owners registered before
        migration 0012 are not known)."""
        owners = await self._run("device_owners_get", (tenant_id, token_hash))
        await self.write_all([
            ("device_deactivate", (reason, now, tenant_id, row["recipient_id"],
                                   row["device_token"]))
            for row in owners])
        return len(owners)

    async def deactivate_device(self, tenant_id: str, owner_hash: str, device_token: str,
                                reason: str, now: datetime) -> None:
        """``active = false`` with the reason (the row must exist: this is an upsert)."""
        await self._run("device_deactivate",
                        (reason, now, tenant_id, owner_hash, device_token))

    # ---------------------------------------------------------------------------- health

    async def ping(self) -> None:
        """One cheap read at the configured consistency; raises when Cassandra cannot answer."""
        await self._run("ping", ())


def date_of(d: datetime) -> date:
    return d.astimezone(UTC).date()


_STATEMENTS: dict[str, str] = {
    "idem_get": "SELECT * FROM idempotency WHERE tenant_id = ? AND idempotency_key = ?",
    "idem_delete": "DELETE FROM idempotency WHERE tenant_id = ? AND idempotency_key = ?",
    "outbox_add": "INSERT INTO outbox_buckets (bucket, shard, created_at, tenant_id, "
    "idempotency_key) VALUES (?, ?, ?, ?, ?)",
    "outbox_remove": "DELETE FROM outbox_buckets WHERE bucket = ? AND shard = ? AND "
    "created_at = ? AND tenant_id = ? AND idempotency_key = ?",
    "outbox_rows": "SELECT * FROM outbox_buckets WHERE bucket = ? AND shard = ? "
    f"LIMIT {OUTBOX_READ_LIMIT}",
    "outbox_legacy_remove": "DELETE FROM outbox_pending WHERE shard = ? AND created_at = ? "
    "AND tenant_id = ? AND idempotency_key = ?",
    "outbox_legacy_rows": f"SELECT * FROM outbox_pending WHERE shard = ? LIMIT {OUTBOX_READ_LIMIT}",
    "outbox_cursor_init": "INSERT INTO outbox_cursor (shard, bucket) VALUES (?, ?) IF NOT EXISTS",
    "outbox_cursor_set": "UPDATE outbox_cursor SET bucket = ? WHERE shard = ?",
    "outbox_park": "INSERT INTO outbox_parked (tenant_id, idempotency_key, created_at, reason, "
    "parked_at) VALUES (?, ?, ?, ?, ?)",
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
    "attempt_insert": "INSERT INTO attempts (message_id, attempt_no, provider_id, "
    "provider_message_id, outcome, normalized_error, error_code, started_at, completed_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "attempts_get": "SELECT * FROM attempts WHERE message_id = ?",
    "provider_index_insert": "INSERT INTO provider_messages (provider_id, provider_message_id, "
    "message_id, attempt_no) VALUES (?, ?, ?, ?)",
    "provider_index_get": "SELECT * FROM provider_messages WHERE provider_id = ? "
    "AND provider_message_id = ?",
    "receipt_get": "SELECT received_at FROM receipts_dedup WHERE provider_id = ? "
    "AND provider_event_id = ?",
    "receipt_put": "INSERT INTO receipts_dedup (provider_id, provider_event_id, message_id, "
    "status, received_at) VALUES (?, ?, ?, ?, ?)",
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
    "pref_get": "SELECT * FROM recipient_preferences WHERE tenant_id = ? AND recipient_hash = ?",
    "pref_insert": "INSERT INTO recipient_preferences (tenant_id, recipient_hash, version, "
    "timezone, quiet_start, quiet_end, opt_outs, suppressed, updated_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
    "pref_update": "UPDATE recipient_preferences SET version = ?, timezone = ?, quiet_start = ?, "
    "quiet_end = ?, opt_outs = ?, suppressed = ?, updated_at = ? "
    "WHERE tenant_id = ? AND recipient_hash = ? IF version = ?",
    "device_get": "SELECT * FROM device_tokens WHERE tenant_id = ? AND recipient_id = ? "
    "AND device_token = ?",
    "device_activate": "UPDATE device_tokens SET platform = ?, active = true, "
    "deactivated_reason = null, updated_at = ? WHERE tenant_id = ? AND recipient_id = ? "
    "AND device_token = ?",
    "device_deactivate": "UPDATE device_tokens SET active = false, deactivated_reason = ?, "
    "updated_at = ? WHERE tenant_id = ? AND recipient_id = ? AND device_token = ?",
    "device_owner_put": "INSERT INTO device_owners (tenant_id, token_hash, recipient_id, "
    "device_token, platform, registered_at) VALUES (?, ?, ?, ?, ?, ?)",
    "device_owners_get": "SELECT recipient_id, device_token FROM device_owners "
    "WHERE tenant_id = ? AND token_hash = ?",
    "tenant_day_page": "SELECT created_at, message_id FROM messages_by_tenant_day "
    "WHERE tenant_id = ? AND day = ? AND created_at >= ? LIMIT ?",
    "tenant_day_ties": "SELECT created_at, message_id FROM messages_by_tenant_day "
    "WHERE tenant_id = ? AND day = ? AND created_at = ? AND message_id > ? LIMIT ?",
    "tenant_day_older": "SELECT created_at, message_id FROM messages_by_tenant_day "
    "WHERE tenant_id = ? AND day = ? AND created_at < ? AND created_at >= ? LIMIT ?",
}

_OPERATOR_STATEMENTS: dict[str, str] = {
    "failure_insert": "INSERT INTO failures_by_tier_day (tier, day, shard, failed_at, "
    "message_id, status, reason, tenant_id, channel, category, attempt, provider_id) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "outcome_insert": "INSERT INTO provider_outcomes_by_hour (provider_id, hour, shard, at, "
    "message_id, ref, kind, outcome, normalized_error, error_code, latency_ms, "
    "provider_message_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
}
"""Writes to migration 0004's tables; prepared separately so a store started before that
migration still works (it skips these writes and logs an error)."""

_TRACE_STATEMENTS = {
    "provider_index_insert_traced": "INSERT INTO provider_messages (provider_id, "
    "provider_message_id, message_id, attempt_no, traceparent) VALUES (?, ?, ?, ?, ?)",
}
"""Migration 0005's trace column (skipped, with an error logged, before that migration)."""
