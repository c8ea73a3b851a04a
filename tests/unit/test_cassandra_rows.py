"""Driver rows (``dict_factory``) as the Cassandra stores' dataclasses: required columns,
optional ones absent, naive UTC timestamps made aware (pure; no Cassandra)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from notiflow.adapters.cassandra.attempts import ProviderIndexRow, attempt_row
from notiflow.adapters.cassandra.idempotency import OutboxRow, ReservationRow
from notiflow.adapters.cassandra.recipients import DeviceRow
from notiflow.adapters.cassandra.values import LAST_EXPIRY, MAX_TTL_S, capped_ttl, from_row
from notiflow.adapters.rows import AttemptRow

NAIVE = datetime(2026, 3, 1, 12, 0, 0)
AWARE = NAIVE.replace(tzinfo=UTC)


def test_a_full_attempt_row() -> None:
    row = {"message_id": "m1", "attempt_no": Decimal(2), "provider_id": "twilio",
           "provider_message_id": "SM1", "outcome": "SUCCESS", "normalized_error": None,
           "error_code": "e", "started_at": NAIVE, "completed_at": AWARE, "other": 1}
    got = attempt_row(row)
    assert got == AttemptRow("m1", 2, "twilio", "SM1", "SUCCESS", None, "e", AWARE, AWARE)
    assert type(got.attempt_no) is int


def test_optional_columns_may_be_absent() -> None:
    assert attempt_row({"message_id": "m1", "attempt_no": 1}) == AttemptRow("m1", 1)
    assert ReservationRow.of({"tenant_id": "t", "idempotency_key": "k"}) == ReservationRow(
        "t", "k")
    assert DeviceRow.of({"tenant_id": "t", "recipient_id": "r", "device_token": "d"}) == (
        DeviceRow("t", "r", "d"))
    assert ProviderIndexRow.of({"provider_id": "p", "provider_message_id": "pm",
                                "message_id": "m"}) == ProviderIndexRow("p", "pm", "m")


def test_timestamps_come_back_aware_and_numbers_as_int() -> None:
    reservation = ReservationRow.of({"tenant_id": "t", "idempotency_key": "k",
                                     "state": "PENDING", "created_at": NAIVE})
    assert reservation.created_at == AWARE and reservation.state == "PENDING"
    device = DeviceRow.of({"tenant_id": "t", "recipient_id": "r", "device_token": "d",
                           "platform": "ios", "active": False, "updated_at": NAIVE})
    assert (device.platform, device.active, device.updated_at) == ("ios", False, AWARE)
    index = ProviderIndexRow.of({"provider_id": "p", "provider_message_id": "pm",
                                 "message_id": "m", "attempt_no": Decimal(3),
                                 "traceparent": "00-x"})
    assert (index.attempt_no, index.traceparent) == (3, "00-x")
    assert type(index.attempt_no) is int
    outbox = OutboxRow.of({"created_at": NAIVE, "tenant_id": "t", "idempotency_key": "k"})
    assert outbox == OutboxRow(AWARE, "t", "k")


@pytest.mark.parametrize("row", [
    {"attempt_no": 1},
    {"message_id": "m1"},
])
def test_a_missing_required_column_is_an_error(row: dict[str, object]) -> None:
    with pytest.raises(KeyError):
        attempt_row(row)


def test_from_row_converts_only_the_named_fields() -> None:
    @dataclass(frozen=True)
    class Pair:
        a: str
        b: str | None = None

    assert from_row(Pair, {"a": "x", "b": "y"}, b=str.upper) == Pair("x", "Y")
    assert from_row(Pair, {"a": "x"}) == Pair("x")


def test_a_ttl_stays_within_what_cassandra_takes() -> None:
    now = datetime(2026, 12, 7, tzinfo=UTC)
    assert capped_ttl(3600.5, now) == 3600
    assert capped_ttl(25 * 365 * 86400, datetime(2000, 1, 1, tzinfo=UTC)) == MAX_TTL_S
    assert capped_ttl(1e12, now) == int((LAST_EXPIRY - now).total_seconds())
    assert capped_ttl(1e12, now) < 2**31
