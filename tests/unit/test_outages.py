"""``adapters/outages.py``: the outage vocabulary holds exactly the driver exceptions it held
when it was gathered in one place, so an edit cannot silently shrink (or widen) what a flow
waits out, what the limiter and the breakers fall back from, or what the API answers 503."""

from __future__ import annotations

from cassandra import (
    CoordinationFailure,
    DriverException,
    InvalidRequest,
    OperationTimedOut,
    Timeout,
    Unavailable,
)
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from redis.exceptions import BusyLoadingError, NoScriptError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from notiflow.adapters.outages import (
    CASSANDRA_DOWN,
    OUTAGE,
    REDIS_DOWN,
    REDIS_UNREACHABLE,
    STORE_FAILURE,
)


def caught(exc: BaseException, by: tuple[type[BaseException], ...]) -> bool:
    return isinstance(exc, by)


def test_each_name_holds_exactly_its_exceptions() -> None:
    assert set(REDIS_DOWN) == {RedisError, OSError}
    assert set(REDIS_UNREACHABLE) == {RedisConnectionError, RedisTimeoutError, OSError}
    assert set(CASSANDRA_DOWN) == {NoHostAvailable, OperationTimedOut, Unavailable, Timeout,
                                   CoordinationFailure, ConnectionException}
    assert set(OUTAGE) == {*CASSANDRA_DOWN, *REDIS_DOWN, TimeoutError}
    assert set(STORE_FAILURE) == {*OUTAGE, DriverException}


def test_an_error_answer_from_redis_is_down_but_not_unreachable() -> None:
    for exc in (ResponseError("ERR user_script:1: boom"), NoScriptError("NOSCRIPT")):
        assert caught(exc, REDIS_DOWN)
        assert not caught(exc, REDIS_UNREACHABLE)
    for exc in (RedisConnectionError(), RedisTimeoutError(), BusyLoadingError(),
                ConnectionRefusedError(), TimeoutError()):
        assert caught(exc, REDIS_UNREACHABLE)
        assert caught(exc, REDIS_DOWN)


def test_a_bare_socket_error_is_an_outage_but_not_cassandras() -> None:
    """The API answers every ``CASSANDRA_DOWN`` with ``503 cassandra_unavailable``; an
    ``OSError`` from elsewhere is not the message store's."""
    assert not caught(OSError(), CASSANDRA_DOWN)
    assert caught(OSError(), OUTAGE)
    assert caught(TimeoutError(), OUTAGE)


def test_bad_input_and_bugs_are_no_outage() -> None:
    for exc in (InvalidRequest("bad cql"), ValueError(), KeyError(), TypeError()):
        assert not caught(exc, OUTAGE)
    assert caught(NoHostAvailable("none", {}), OUTAGE)


def test_a_refused_statement_is_a_store_failure_but_no_outage() -> None:
    assert caught(InvalidRequest("unconfigured table messages"), STORE_FAILURE)
    assert caught(NoHostAvailable("none", {}), STORE_FAILURE)
    assert not caught(ValueError(), STORE_FAILURE)
