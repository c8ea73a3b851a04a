"""Cassandra sessions and the statement runner every store of this package shares.

:func:`connect` opens every Cassandra session of notiflow (TLS and authentication from
:func:`cluster_security`); :func:`aio` bridges a driver future to asyncio. A
:class:`Statements` holds the prepared statements of one session by name: each store
prepares its own into it, and any store's writes can then share one request
(:meth:`Statements.write_all`). Every call is asynchronous (the driver's own I/O thread
resolves an asyncio future), so a Bytewax worker or the API loop can run many at once.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from cassandra import ConsistencyLevel, InvalidRequest
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    ResponseFuture,
    Session,
)
from cassandra.policies import DCAwareRoundRobinPolicy, RetryPolicy
from cassandra.query import BatchStatement, BatchType, PreparedStatement, dict_factory

from notiflow.adapters.cassandra_coalesce import CassandraCoalescer, KeyedRead
from notiflow.settings import CassandraSecurity, Settings, TlsFiles

log = logging.getLogger(__name__)
logging.getLogger("cassandra").setLevel(logging.ERROR)

Row = dict[str, Any]
"""A row as the driver returns it (``dict_factory``)."""
Write = tuple[str, tuple[Any, ...]]
"""A prepared statement's name and its parameters (see :meth:`Statements.write_all`)."""


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


def aio(rf: ResponseFuture) -> asyncio.Future[list[Row]]:
    """Bridge a driver ``ResponseFuture`` to the running asyncio loop (first page only)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[Row]] = loop.create_future()

    def _ok(rows: list[Row]) -> None:
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


class Statements:
    """The prepared statements of one session by name, and their runner. Names are unique
    across the stores sharing it. After :meth:`coalesce`, keyed reads (:meth:`read`) and
    writes (:meth:`write_all`) made in one event-loop turn share requests
    (:mod:`notiflow.adapters.cassandra_coalesce`)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._stmts: dict[str, PreparedStatement] = {}
        self._cql: dict[str, str] = {}
        self._keys: dict[str, tuple[str, str]] = {}
        self._keyed: dict[str, KeyedRead] = {}
        self._coalescer: CassandraCoalescer | None = None

    def prepare(self, statements: Mapping[str, str], *, optional: bool = False,
                consistency: int | None = None) -> None:
        """Prepare each ``name: cql``. ``optional``: a statement Cassandra refuses (its
        migration has not run yet, during a rolling deploy) is skipped with an error logged;
        callers test :meth:`has` before writing it."""
        for name, cql in statements.items():
            if name in self._stmts:
                raise ValueError(f"statement {name} is prepared twice")
            try:
                stmt = self.session.prepare(cql)
            except InvalidRequest as exc:
                if not optional:
                    raise
                log.error("operator query tables or columns missing (%s): run "
                          "`notiflow stack migrate`", exc)
                continue
            if consistency is not None:
                stmt.consistency_level = consistency
            self._stmts[name], self._cql[name] = stmt, cql

    def has(self, name: str) -> bool:
        return name in self._stmts

    def keyed(self, name: str, column: str, also: str = "") -> None:
        """Declare ``name``'s read coalescible on its last key ``column`` (``also``: columns
        selected besides, which tell the rows of an ``IN`` read apart)."""
        self._keys[name] = (column, also)

    def coalesce(self, *, max_keys: int, max_rows: int) -> None:
        """Prepare the ``IN`` form of every :meth:`keyed` read and coalesce from now on."""
        for name, (column, also) in self._keys.items():
            cql = self._cql[name].replace("SELECT ", f"SELECT {also}", 1)
            self._keyed[name] = KeyedRead(self.session.prepare(
                cql.replace(f"{column} = ?", f"{column} IN ?")), column)
        self._coalescer = CassandraCoalescer(self.session, aio, max_keys=max_keys,
                                             max_rows=max_rows)

    def run(self, name: str, params: Sequence[Any]) -> asyncio.Future[list[Row]]:
        return aio(self.session.execute_async(self._stmts[name], params))

    async def first(self, name: str, params: Sequence[Any]) -> Row | None:
        """The first row of ``name``, None when there is none."""
        rows = await self.run(name, params)
        return rows[0] if rows else None

    def read(self, name: str, prefix: tuple[Any, ...], key: Any) -> Awaitable[Row | None]:
        """The row of keyed read ``name`` for ``(*prefix, key)`` (an ``IN`` read shared with
        the callers of the same event-loop turn when coalescing, registered at once)."""
        if self._coalescer is not None:
            return self._coalescer.read(self._keyed[name], prefix, key)
        return self.first(name, (*prefix, key))

    def read_each(self, name: str, keys: Sequence[tuple[tuple[Any, ...], Any]]
                  ) -> Awaitable[list[Row | None]]:
        """:meth:`read` of each ``(prefix, key)``, in order."""
        return asyncio.gather(*(self.read(name, p, k) for p, k in keys))

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
            await self.run(*writes[0])
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
