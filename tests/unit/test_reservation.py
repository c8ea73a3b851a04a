"""Reserving an Idempotency-Key (``gateway/reservation.py``): fences, the key's row, and the
lightweight transaction without Redis, with the store and the fence faked."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from notiflow.adapters.cassandra.idempotency import Reservation, ReservationRow
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.idempotency_fence import Fence, FenceUnavailable, Holder
from notiflow.gateway import reservation
from notiflow.gateway.errors import ApiError
from notiflow.gateway.reservation import Claim, Reserved, Taken, reserve

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def claim(request_hash: str = "h1", message_id: str = "m1") -> Claim:
    return Claim("acme", "k1", request_hash, message_id, "topic", "{}", NOW)


class FakeStore:
    def __init__(self, rows: list[ReservationRow | None] | None = None,
                 lwt: Reservation | None = None, fail: bool = False) -> None:
        self.rows = list(rows or [None])
        self.reads = 0
        self.lwt = lwt
        self.lwts = 0
        self.fail = fail

    @property
    def idempotency(self) -> FakeStore:
        return self

    async def get_reservation(self, tenant_id: str, key: str) -> ReservationRow | None:
        self.reads += 1
        if self.fail:
            raise TimeoutError("read timed out")
        return self.rows.pop(0) if len(self.rows) > 1 else self.rows[0]

    async def reserve(self, *args: Any) -> Reservation:
        self.lwts += 1
        assert self.lwt is not None
        return self.lwt


class FakeFence:
    def __init__(self, holder: Holder | None = None, down: bool = False) -> None:
        self.holder = holder
        self.down = down
        self.claims: list[Holder] = []
        self.released: list[Holder] = []

    async def claim(self, tenant_id: str, key: str, holder: Holder) -> Holder | None:
        if self.down:
            raise FenceUnavailable("redis: ConnectionError")
        self.claims.append(holder)
        if self.holder is not None:
            return self.holder
        self.holder = holder
        return None

    async def release(self, tenant_id: str, key: str, holder: Holder) -> bool:
        self.released.append(holder)
        if self.holder == holder:
            self.holder = None
            return True
        return False


def run(store: FakeStore, fence: FakeFence | None, c: Claim, *,
        client_key: bool = True) -> Reserved | Taken:
    return asyncio.run(reserve(cast(CassandraStore, store), cast(Fence | None, fence), c,
                               client_key=client_key))


@pytest.fixture(autouse=True)
def no_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reservation, "ROW_WAITS_S", (0.0, 0.0, 0.0))


def test_a_key_the_api_minted_is_written_plainly_without_fence_or_read() -> None:
    store, fence = FakeStore(), FakeFence()
    out = run(store, fence, claim(), client_key=False)
    assert out == Reserved((claim().write(),))
    assert (store.reads, store.lwts, fence.claims) == (0, 0, [])


def test_a_free_fence_and_no_row_make_the_key_this_requests() -> None:
    store, fence = FakeStore(), FakeFence()
    out = run(store, fence, claim())
    assert out == Reserved((claim().write(),), Holder("h1", "m1"))
    assert out.writes[0][0] == "reservation_put"
    assert store.lwts == 0


def test_an_existing_row_answers_and_the_fence_taken_for_nothing_is_released() -> None:
    row = ReservationRow("acme", "k1", request_hash="h1", message_id="m0", state="ACCEPTED")
    store, fence = FakeStore([row]), FakeFence()
    assert run(store, fence, claim()) == Taken(row)
    assert fence.holder is None
    assert fence.released == [Holder("h1", "m1")]


def test_an_existing_row_wins_over_a_fence_another_body_holds() -> None:
    row = ReservationRow("acme", "k1", request_hash="h1", message_id="m0", state="PENDING")
    store, fence = FakeStore([row]), FakeFence(Holder("other", "m9"))
    assert run(store, fence, claim()) == Taken(row)
    assert fence.released == []


def test_a_fence_held_for_another_body_is_a_conflict() -> None:
    store, fence = FakeStore(), FakeFence(Holder("other", "m9"))
    with pytest.raises(ApiError) as err:
        run(store, fence, claim())
    assert (err.value.status, err.value.error) == (409, "idempotency_conflict")
    assert store.reads == 1


def test_a_fence_held_for_the_same_body_waits_for_the_holders_row() -> None:
    row = ReservationRow("acme", "k1", request_hash="h1", message_id="m9", state="PENDING")
    store, fence = FakeStore([None, None, row]), FakeFence(Holder("h1", "m9"))
    assert run(store, fence, claim()) == Taken(row)
    assert store.reads == 3


def test_a_holders_row_that_never_appears_is_503_in_progress() -> None:
    store, fence = FakeStore(), FakeFence(Holder("h1", "m9"))
    with pytest.raises(ApiError) as err:
        run(store, fence, claim())
    assert (err.value.status, err.value.reason) == (503, "acceptance_in_progress")
    assert "Retry-After" in err.value.headers
    assert store.reads == 1 + len(reservation.ROW_WAITS_S)


@pytest.mark.parametrize("fence", [None, FakeFence(down=True)], ids=["off", "down"])
def test_without_a_fence_the_key_is_reserved_by_transaction(fence: FakeFence | None) -> None:
    store = FakeStore(lwt=Reservation(True, None))
    assert run(store, fence, claim()) == Reserved(())
    assert store.lwts == 1


def test_a_transaction_not_applied_answers_from_the_row_it_returned() -> None:
    row = ReservationRow("acme", "k1", request_hash="h1", message_id="m0", state="ACCEPTED")
    store = FakeStore(lwt=Reservation(False, row))
    assert run(store, None, claim()) == Taken(row)


def test_a_transaction_not_applied_without_a_row_is_503() -> None:
    store = FakeStore(lwt=Reservation(False, None))
    with pytest.raises(ApiError) as err:
        run(store, None, claim())
    assert err.value.reason == "acceptance_in_progress"


def test_a_failed_read_releases_the_fence_it_took_and_raises() -> None:
    store, fence = FakeStore(fail=True), FakeFence()
    with pytest.raises(TimeoutError):
        run(store, fence, claim())
    assert fence.holder is None


def test_a_holder_round_trips_through_its_value() -> None:
    holder = Holder("a" * 64, "01JDX-msg_id")
    assert Holder.parse(holder.value) == holder
