"""What a store raises while it is down: the one vocabulary of every layer.

Catching one of these tuples means "wait, retry or fall back", never "a bug" nor "bad input".
They hold the drivers' exception classes, so a flow or the API can catch an outage without
importing a driver itself; :mod:`notiflow.adapters.ports` stays driver-free.

- :data:`REDIS_DOWN`: a Redis call failed, whatever the reason (a fallback is the answer);
- :data:`REDIS_UNREACHABLE`: Redis did not answer at all (an error answer is not an outage);
- :data:`CASSANDRA_DOWN`: the Cassandra driver's "try again later";
- :data:`OUTAGE`: any of them, or a timeout: what :mod:`notiflow.adapters.retrying` waits out;
- :data:`STORE_FAILURE`: an :data:`OUTAGE` or any other Cassandra driver error: what a caller
  answers "unavailable" to instead of failing (the API before its schema exists, the inbox).

Whether Redis counts as down for the whole process is decided by
:class:`notiflow.adapters.redis_health.RedisHealth` on :data:`REDIS_UNREACHABLE` alone.
"""

from __future__ import annotations

from cassandra import (
    CoordinationFailure,
    DriverException,
    OperationTimedOut,
    Timeout,
    Unavailable,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

REDIS_DOWN: tuple[type[Exception], ...] = (RedisError, OSError)
"""A Redis call failed (any Redis error, or its socket): wait, or take the fallback."""

REDIS_UNREACHABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError,
                                                  OSError)
"""Redis did not answer (connection refused or lost, timeout). Narrower than
:data:`REDIS_DOWN` on purpose: an error *answer* (``ResponseError``: a Lua script failing,
a wrong-type key) is a bug to surface, not a reason for the capacity limiter or the circuit
breakers to decide locally."""

CASSANDRA_DOWN: tuple[type[Exception], ...] = (
    NoHostAvailable, OperationTimedOut, Unavailable, Timeout, CoordinationFailure,
    ConnectionException)
"""Cassandra failures that mean "try again later" (not a bug, not bad input). No bare
``OSError``: the API answers each of these ``503 cassandra_unavailable``."""

OUTAGE: tuple[type[Exception], ...] = (*CASSANDRA_DOWN, *REDIS_DOWN, TimeoutError)
"""What a store raises while it is down or unreachable (any socket error included)."""

STORE_FAILURE: tuple[type[Exception], ...] = (*OUTAGE, DriverException)
"""A store call failed for a reason no caller's input explains: an :data:`OUTAGE`, or any
other error of the Cassandra driver (a table not created yet, a statement refused)."""
