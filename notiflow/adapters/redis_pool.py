"""One way to open an asyncio Redis client (a blocking connection pool), and a coalescer of
the commands many coroutines issue at once.

redis-py's default asyncio pool holds at most 100 connections and *fails* a command with
``MaxConnectionsError`` ("Too many connections") the moment they are all in use. A send flow
has hundreds of sends in flight, each making Redis calls; under a campaign flood that error
read as "Redis down" (pausing P3, and sending P0 without cluster dedup). A blocking pool makes
a command wait for a free connection instead, bounded by ``timeout``, so only a Redis that is
really slow or gone produces an error.

A ``redis+sentinel://`` URL (:func:`sentinel_address`) gives the same client on the primary
that Redis Sentinel names: every new connection asks the sentinels where the primary is, so
after a failover the client's next connections reach the promoted replica (commands in flight
on the old primary fail, and each caller's Redis-down policy handles them).

``rediss://`` and ``rediss+sentinel://`` URLs connect with TLS (to the sentinels and the
primary alike), trusting and presenting the files of the settings' ``redis_security``
(:func:`tls_options`); its credentials apply to every connection (:func:`auth_options`).
Every Redis client of notiflow comes from :func:`redis_client`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from notiflow.settings import RedisSecurity, Settings

SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
"""Sentinel URL schemes, and whether each connects with TLS."""

LUA_NOW_US: Final = """
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[1])
end
"""
"""The first lines of a script that decides on Redis's clock: ``now`` in µs from ``TIME``, or
``ARGV[1]`` when a test gives the time."""

MAX_CONNECTIONS = 64
"""Connections per client (per worker event loop); Redis answers each call in well under a
millisecond on loopback, so 64 connections serve tens of thousands of calls per second."""


POOL_WAIT_S = 60.0
"""How long a command may wait for a free connection of its pool. Not a health signal: a
process starved of CPU (a P3 flow at ``nice 10`` on a saturated host) holds its connections
longer while its event loop catches up, and a 5 s pool wait there read as "Redis down"
(``notiflow bench isolation``: the P3 and shared flows paused sends hundreds of times). A
Redis that is really gone fails each connection within the socket timeout, freeing it for
the next waiter, so the long wait does not hide an outage."""


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """Where Sentinel is asked for a primary: ``redis+sentinel://[:password@]host:port[,
    host:port...]/service[/db]`` (the password is the primary's, not the sentinels')."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    password: str | None = None
    tls: bool = False
    """``rediss+sentinel://``: TLS to the sentinels and to the primary."""


def sentinel_address(url: str) -> SentinelAddress | None:
    """The :class:`SentinelAddress` of a ``redis+sentinel://`` or ``rediss+sentinel://``
    URL, None for any other scheme; ``ValueError`` for a sentinel URL without sentinels or
    service."""
    parts = urlsplit(url)
    if parts.scheme not in SENTINEL_SCHEMES:
        return None
    creds, _, hosts = parts.netloc.rpartition("@")
    sentinels = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"sentinel {host!r} is not host:port")
        sentinels.append((name, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not sentinels or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("a sentinel URL is redis+sentinel://host:port[,host:port]/service[/db]")
    password = unquote(creds.partition(":")[2]) if creds else None
    return SentinelAddress(tuple(sentinels), path[0], int(path[1]) if len(path) == 2 else 0,
                           password or None, SENTINEL_SCHEMES[parts.scheme])


def uses_tls(url: str) -> bool:
    """Whether ``url`` connects with TLS (``rediss://``, ``rediss+sentinel://``)."""
    address = sentinel_address(url)
    return address.tls if address is not None else urlsplit(url).scheme == "rediss"


def tls_options(security: RedisSecurity) -> dict[str, Any]:
    """redis-py's ``ssl_*`` connection arguments of ``security`` (for TLS connections only:
    a plain connection refuses them)."""
    options: dict[str, Any] = {"ssl_cert_reqs": "required",
                               "ssl_check_hostname": security.check_hostname}
    files = {"ssl_ca_certs": security.ca_file, "ssl_certfile": security.cert_file,
             "ssl_keyfile": security.key_file}
    options.update({k: str(v) for k, v in files.items() if v is not None})
    if security.key_password is not None:
        options["ssl_password"] = security.key_password.get_secret_value()
    return options


def auth_options(security: RedisSecurity) -> dict[str, Any]:
    """redis-py's ``username``/``password`` arguments of ``security`` (empty when unset)."""
    if security.password is None:
        return {}
    return {"username": security.username,
            "password": security.password.get_secret_value()}


def reconnect_once() -> Retry:
    """A ``retry`` for :func:`redis_client`: a command that fails with a connection error
    (not a timeout) is sent once more, at once, on a new connection. After a Redis restart
    every pooled connection is closed on the server's side and fails its next command;
    without this each one read as "Redis down" once (the API refused P2/P3 for a second at
    a time until all of them had failed). The price: a command whose reply alone was lost
    runs twice, so only callers whose commands tolerate that (or recognise their own
    earlier write) use it."""
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Sentinel's pool of connections to the current primary, waiting for a free connection
    as :func:`redis_client`'s pool does."""


def redis_client(settings: Settings, *, timeout: float, connect_timeout: float | None = None,
                 max_connections: int = MAX_CONNECTIONS, pool_wait: float = POOL_WAIT_S,
                 **kwargs: Any) -> aioredis.Redis:
    """A client of ``settings.redis_url`` whose commands time out after ``timeout`` on the
    socket and wait up to ``pool_wait`` for a free connection (the API's admission, which
    must answer fast, waits no longer than its ``timeout``). The URL: ``redis[s]://`` or
    ``redis[s]+sentinel://`` (:func:`sentinel_address`); ``settings.redis_security`` gives
    its TLS files and credentials. ``kwargs`` go to each connection (``retry``,
    ``health_check_interval``…); responses are decoded to ``str``."""
    url, security = settings.redis_url, settings.redis_security
    connect = connect_timeout if connect_timeout is not None else timeout
    tls = tls_options(security) if uses_tls(url) else {}
    options: dict[str, Any] = {
        "max_connections": max_connections, "timeout": max(timeout, pool_wait),
        "socket_timeout": timeout, "socket_connect_timeout": connect,
        "decode_responses": True, **auth_options(security), **tls, **kwargs}
    address = sentinel_address(url)
    if address is not None:
        asked = {"socket_timeout": timeout, "socket_connect_timeout": connect,
                 **({"ssl": True, **tls} if address.tls else {})}
        if address.password is not None:
            options["password"] = address.password
        sentinel = Sentinel(  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            list(address.sentinels), sentinel_kwargs=asked)
        client: aioredis.Redis = sentinel.master_for(
            address.service, connection_pool_class=BlockingSentinelPool, db=address.db,
            ssl=address.tls, **options)
        return client
    pool = aioredis.BlockingConnectionPool.from_url(url, **options)
    return aioredis.Redis(connection_pool=pool)


class Coalescer:
    """Commands issued during one turn of the event loop, sent to Redis as one pipeline (no
    transaction) on the next turn. A send flow has up to ``max_in_flight`` sends per channel
    confirming and finishing their leases at the same moments; one round trip for all of
    them replaces one per message (``notiflow bench throughput``: the per-call client cost
    was the send flow's largest Redis item). Each caller awaits its own reply: a command
    error fails only its caller, a connection error every caller of that round trip."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.r = client
        self._queued: list[tuple[Callable[[Any], object], asyncio.Future[Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def call(self, queue: Callable[[Any], object]) -> asyncio.Future[Any]:
        """``queue(pipeline)`` adds one command; the future resolves to its reply."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if not self._queued:
            loop.call_soon(self._start)
        self._queued.append((queue, fut))
        return fut

    def _start(self) -> None:
        task = asyncio.get_running_loop().create_task(self._flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self) -> None:
        queued, self._queued = self._queued, []
        if not queued:
            return
        pipe = self.r.pipeline(transaction=False)
        for queue, _ in queued:
            queue(pipe)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            for _, fut in queued:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, fut), reply in zip(queued, replies, strict=True):
            if fut.done():
                continue
            if isinstance(reply, Exception):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)
