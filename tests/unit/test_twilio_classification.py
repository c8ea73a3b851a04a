"""The Twilio classification tables, row by row (pure; no network)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import Rule, classify_exception, parse_retry_after
from notiflow.providers.twilio.classify import (
    ERROR_CODES,
    HTTP_STATUSES,
    STATUS_CLASSES,
    classify_response,
    error_code_of,
)
from notiflow.providers.twilio.client import status_callback
from tests.unit import classification_cases as cases
from tests.unit.classification_cases import A, P, T

EXPECTED_CODES: dict[int, tuple[Outcome, str, bool]] = {
    20003: (T, "auth_failed", False),
    20005: (T, "account_inactive", False),
    20404: (T, "misconfigured", False),
    21212: (T, "misconfigured", False),
    21606: (T, "misconfigured", False),
    20429: (T, "rate_limited", False),
    21611: (T, "rate_limited", False),
    20500: (A, "server_error", False),
    20503: (T, "server_error", False),
    21211: (P, "invalid_recipient", False),
    21265: (P, "invalid_recipient", False),
    21266: (P, "invalid_recipient", False),
    21604: (P, "invalid_recipient", False),
    21614: (P, "not_mobile", False),
    21635: (P, "not_mobile", False),
    21612: (P, "unreachable_recipient", False),
    21408: (P, "region_not_permitted", False),
    21608: (P, "unverified_recipient", False),
    21610: (P, "unsubscribed", True),
    21602: (P, "invalid_content", False),
    21617: (P, "invalid_content", False),
}

CODE_STATUS = {20003: 401, 20429: 429, 20500: 500, 20503: 503}
"""The HTTP status Twilio answers an error code with, where it is not 400."""


def test_tables_have_exactly_the_reviewed_rows() -> None:
    assert set(ERROR_CODES) == set(EXPECTED_CODES)
    cases.assert_http_tables(HTTP_STATUSES, STATUS_CLASSES)


@pytest.mark.parametrize(("code", "expected"), sorted(EXPECTED_CODES.items()))
def test_error_code_row(code: int, expected: tuple[Outcome, str, bool]) -> None:
    assert classify_response(CODE_STATUS.get(code, 400), code) == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"), sorted(cases.HTTP_DEFAULT_STATUSES.items()))
def test_http_status_row_without_code(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status, None) == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"), sorted(cases.HTTP_DEFAULT_STATUSES.items()))
def test_http_status_row_with_unknown_code(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status, 99999) == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"),
                         cases.status_class_cases(102, 202, 302, 418, 422, 507, 599, 600))
def test_status_class_fallback(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status, None) == Rule(*expected)


def test_error_code_wins_over_http_status() -> None:
    assert classify_response(500, 21211) == Rule(P, "invalid_recipient")
    assert classify_response(400, 20429) == Rule(T, "rate_limited")


def test_only_unsubscribed_deactivates_the_recipient() -> None:
    assert [c for c, r in ERROR_CODES.items() if r.deactivate] == [21610]


def test_credentials_never_fail_a_message_permanently() -> None:
    for code in (20003, 20005, 20404, 21212, 21606):
        assert ERROR_CODES[code].outcome is T
    assert HTTP_STATUSES[401].outcome is T


def _connector_error(exc: OSError) -> aiohttp.ClientConnectorError:
    key = ConnectionKey("127.0.0.1", 1, False, True, None, None, None)
    return aiohttp.ClientConnectorError(key, exc)


@pytest.mark.parametrize(("exc", "expected"), [
    (aiohttp.ConnectionTimeoutError("connect"), (T, "connect_timeout")),
    (_connector_error(ConnectionRefusedError(111, "refused")), (T, "connect_error")),
    (aiohttp.ClientConnectorDNSError(
        ConnectionKey("nx.invalid", 443, True, True, None, None, None), OSError(-2, "dns")),
     (T, "connect_error")),
    (aiohttp.InvalidURL("http://"), (T, "misconfigured")),
    (TimeoutError(), (A, "timeout")),
    (aiohttp.SocketTimeoutError("read"), (A, "timeout")),
    (aiohttp.ServerTimeoutError("read"), (A, "timeout")),
    (aiohttp.ServerDisconnectedError(), (A, "connection_lost")),
    (aiohttp.ClientPayloadError("cut"), (A, "connection_lost")),
    (aiohttp.ClientOSError(104, "reset"), (A, "connection_lost")),
    (aiohttp.ClientError("other"), (A, "transport_error")),
    (RuntimeError("bug"), (A, "client_error")),
])
def test_transport_error_row(exc: BaseException, expected: tuple[Outcome, str]) -> None:
    assert classify_exception(exc) == Rule(*expected)


@pytest.mark.parametrize(("payload", "code"), [
    ({"code": 21211, "message": "x", "status": 400}, 21211),
    ({"code": "20429"}, 20429),
    ({"code": None}, None),
    ({"code": True}, None),
    ({"message": "no code"}, None),
    ([1, 2], None),
    (None, None),
])
def test_error_code_of(payload: object, code: int | None) -> None:
    assert error_code_of(payload) == code


def test_retry_after_seconds_and_dates() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("7", now=now) == 7.0
    assert parse_retry_after(" 0.25 ", now=now) == 0.25
    assert parse_retry_after("-3", now=now) == 0.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True),
                             now=now) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True),
                             now=now) == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None
    assert parse_retry_after("soon") is None


def test_status_callback_carries_message_id_and_attempt() -> None:
    assert (status_callback("http://h/webhooks/twilio", "m 1", 2)
            == "http://h/webhooks/twilio?message_id=m+1&attempt=2")
    assert (status_callback("http://h/cb?tenant=a", "m1", 1)
            == "http://h/cb?tenant=a&message_id=m1&attempt=1")
