"""One way to open an asyncio Redis client: a blocking connection pool.

redis-py's default asyncio pool holds at most 100 connections and *fails* a command with
``MaxConnectionsError`` ("Too many connections") the moment they are all in use. A send flow
has hundreds of sends in flight, each making Redis calls; under a campaign flood that error
read as "Redis down" (pausing P3, and sending P0 without cluster dedup). A blocking pool makes
a command wait for a free connection instead, bounded by ``timeout``, so only a Redis that is
really slow or gone produces an error.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

MAX_CONNECTIONS = 64
"""Connections per client (per worker event loop); Redis answers each call in well under a
millisecond on loopback, so 64 connections serve tens of thousands of calls per second."""


def redis_client(url: str, *, timeout: float, connect_timeout: float | None = None,
                 max_connections: int = MAX_CONNECTIONS, **kwargs: Any) -> aioredis.Redis:
    """A client whose pool waits up to ``timeout`` for a free connection; ``timeout`` is also
    the socket timeout. ``kwargs`` go to each connection (``retry``, ``health_check_interval``…);
    responses are decoded to ``str``."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=timeout, socket_timeout=timeout,
        socket_connect_timeout=connect_timeout if connect_timeout is not None else timeout,
        decode_responses=True, **kwargs)
    return aioredis.Redis(connection_pool=pool)
