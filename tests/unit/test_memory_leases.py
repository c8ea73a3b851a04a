"""The memory Leases port: the semantics of ``redis_dedup`` (pending and done values,
take-over, release, content claims, crash counts) and of the cancel gate, answering exactly
like ``cancel_gate.GateModel`` and, with expiry, like a naive model of the contract."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from hypothesis import given
from hypothesis import strategies as st

from notiflow.adapters.cancel_gate import CANCELLED, SENDING, GateModel
from notiflow.adapters.memory.leases import LeaseTable, MemoryLeases
from notiflow.adapters.ports import Confirm
from notiflow.correlation import CorrelationKeys
from notiflow.schemas.campaigns import row_message_id
from tests.fakes import ManualClock

KEYS = CorrelationKeys((b"g" * 32,))
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
TTL = timedelta(seconds=10)
T = TypeVar("T")


def pair() -> tuple[ManualClock[datetime], MemoryLeases, MemoryLeases]:
    clock = ManualClock(T0)
    table = LeaseTable(clock)
    return clock, MemoryLeases(table, "us", "ns.", KEYS), MemoryLeases(table, "them", "ns.",
                                                                       KEYS)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_acquire_tells_a_free_a_pending_and_a_done_lease() -> None:
    clock, us, them = pair()
    key = us.lease_key("m", 1)
    assert key == "ns.lease:m:1"
    [first] = run(us.acquire([key], TTL))
    assert first.acquired
    [held] = run(them.acquire([key], TTL))
    assert not held.acquired and held.pending_owner() == "us"
    assert held.pending_since_ms() == int(T0.timestamp() * 1000)
    run(us.finish([(key, {"status": "PROVIDER_ACCEPTED"})], TTL))
    [done] = run(them.acquire([key], TTL))
    assert done.done == {"status": "PROVIDER_ACCEPTED"}
    clock.advance(TTL)
    assert run(them.acquire([key], TTL))[0].acquired


def test_take_over_needs_the_exact_stale_value() -> None:
    _, us, them = pair()
    key = us.lease_key("m", 1)
    run(us.acquire([key], TTL))
    [held] = run(them.acquire([key], TTL))
    assert not run(them.take_over(key, "pending:us:0", TTL))
    assert run(them.take_over(key, held.holder or "", TTL))
    assert run(us.confirm(key, us.gate_key("m"), TTL)) is Confirm.LOST
    assert run(them.confirm(key, them.gate_key("m"), TTL)) is Confirm.OURS


def test_release_drops_only_our_own_pending_lease() -> None:
    _, us, them = pair()
    key = us.lease_key("m", 1)
    run(us.acquire([key], TTL))
    run(them.release([key]))
    assert not run(them.acquire([key], TTL))[0].acquired
    run(us.release([key]))
    assert run(them.acquire([key], TTL))[0].acquired


def test_confirm_sets_sending_for_the_ttl_and_clear_frees_the_gate() -> None:
    clock, us, _ = pair()
    key, gate = us.lease_key("m", 1), us.gate_key("m")
    run(us.acquire([key], TTL))
    assert run(us.confirm(key, gate, TTL)) is Confirm.OURS
    assert us.table.get(gate) == SENDING and not us.table.cancel(gate, TTL)
    run(us.finish([], TTL, [gate]))
    assert us.table.get(gate) is None and us.table.cancel(gate, TTL)
    assert run(us.confirm(key, gate, TTL)) is Confirm.CANCELLED
    clock.advance(TTL)
    assert us.table.get(gate) is None


def test_a_campaign_cancel_stops_its_messages_only() -> None:
    _, us, _ = pair()
    camp = "cmp_" + "a" * 32
    mid = row_message_id(KEYS, camp, 7)
    campaign = us.campaign_gate_key(mid)
    assert campaign == f"ns.campaign-gate:{camp}"
    assert us.campaign_gate_key("msg_plain") is None
    us.table.cancel(campaign, TTL)
    key = us.lease_key(mid, 1)
    assert run(us.confirm(key, us.gate_key(mid), TTL, campaign)) is Confirm.CANCELLED
    assert run(us.confirm(us.lease_key("x", 1), us.gate_key("x"), TTL)) is Confirm.OURS


def test_content_claims_and_crash_counts() -> None:
    clock, us, them = pair()
    key = us.content_key("acme", "fp")
    assert run(us.claim_content([(key, "m1")], TTL)) == [None]
    assert run(them.claim_content([(key, "m1"), (key, "m2")], TTL)) == [None, "m1"]
    run(them.release_content([(key, "m2")]))
    assert run(them.claim_content([(key, "m2")], TTL)) == ["m1"]
    other = us.content_key("acme", "fp2")
    assert run(us.claim_content([(other, "m12")], TTL)) == [None]
    run(us.release_content([(other, "m1")]))
    assert run(them.claim_content([(other, "m2")], TTL)) == ["m12"], "a prefix released it"
    run(us.release_content([(key, "m1")]))
    assert run(them.claim_content([(key, "m2")], TTL)) == [None]
    assert [run(us.count_crash("send.p1", "t:0:1", TTL)) for _ in range(2)] == [1, 2]
    assert run(them.crashes("send.p1")) == {"t:0:1": 2}
    clock.advance(TTL)
    assert run(them.crashes("send.p1")) == {}


GATE_OPS = st.lists(st.tuples(st.sampled_from(["cancel", "confirm", "clear", "done"]),
                              st.integers(0, 1)), max_size=30)


@given(GATE_OPS)
def test_gates_answer_like_the_reference_model(steps: list[tuple[str, int]]) -> None:
    """No time passes: every answer and every key equal ``GateModel``'s."""
    _, us, them = pair()
    model = GateModel()
    key, gate = us.lease_key("m", 1), us.gate_key("m")
    for op, who in steps:
        port = (us, them)[who]
        if op == "cancel":
            assert us.table.cancel(gate, TTL) is model.cancel(gate)
        elif op == "confirm":
            got = run(port.confirm(key, gate, TTL))
            value = port.table.kv.get(key) if got is Confirm.OURS else f"{port.pending_prefix}0"
            assert got is model.confirm(key, gate, port.pending_prefix, value or "")
        elif op == "clear":
            run(port.finish([], TTL, [gate]))
            model.clear(gate)
        else:
            run(port.finish([(key, {"n": 1})], TTL))
            model.kv[key] = 'done:{"n":1}'
        assert us.table.kv == model.kv


LEASE_OPS = st.lists(st.tuples(
    st.sampled_from(["acquire", "take_over", "confirm", "cancel", "finish", "retry",
                     "release", "wait"]),
    st.integers(0, 1), st.integers(1, 15)), max_size=40)


@given(LEASE_OPS)
def test_one_sender_at_a_time_and_a_cancel_or_a_send_never_both(
        steps: list[tuple[str, int, int]]) -> None:
    """Two senders and the API under expiry. A naive model of the contract decides every
    answer: a confirm is ours iff the lease is free or our pending value and the gate is not
    cancelled; a cancel lands iff the gate is free or cancelled; values expire after their
    TTL. And nobody confirms while another's confirmed lease is live, unless it was taken
    over (its owner is deemed dead), finished or released."""
    clock, us, them = pair()
    key, gate = us.lease_key("m", 1), us.gate_key("m")
    kv: dict[str, tuple[str, datetime]] = {}
    confirmed: dict[str, datetime] = {}

    def live(k: str) -> str | None:
        entry = kv.get(k)
        if entry is None or entry[1] <= clock():
            kv.pop(k, None)
            return None
        return entry[0]

    for op, who, n in steps:
        port, other = (us, them)[who], (us, them)[1 - who]
        ttl = timedelta(seconds=n)
        if op == "wait":
            clock.advance(n)
            continue
        if op == "acquire":
            [got] = run(port.acquire([key], ttl))
            assert got.acquired is (live(key) is None)
            if got.acquired:
                kv[key] = (f"{port.pending_prefix}{port.table.now_ms()}", clock() + ttl)
        elif op == "take_over":
            stale = live(key) or ""
            assert run(port.take_over(key, stale, ttl)) is bool(stale)
            if stale:
                kv[key] = (f"{port.pending_prefix}{port.table.now_ms()}", clock() + ttl)
                confirmed.clear()
        elif op == "confirm":
            v, g = live(key), live(gate)
            ours = v is None or v.startswith(port.pending_prefix)
            want = (Confirm.LOST if not ours else Confirm.CANCELLED if g == CANCELLED
                    else Confirm.OURS)
            assert run(port.confirm(key, gate, ttl)) is want
            if want is Confirm.OURS:
                holder = confirmed.get(other.owner)
                assert holder is None or holder <= clock() or live(key) is None
                kv[key] = (f"{port.pending_prefix}{port.table.now_ms()}", clock() + ttl)
                kv[gate] = (SENDING, clock() + ttl)
                confirmed = {port.owner: clock() + ttl}
        elif op == "cancel":
            g = live(gate)
            assert port.table.cancel(gate, ttl) is (g in (None, CANCELLED))
            if g in (None, CANCELLED):
                kv[gate] = (CANCELLED, clock() + ttl)
        elif op == "finish":
            run(port.finish([(key, {"ok": True})], ttl))
            kv[key] = ('done:{"ok":true}', clock() + ttl)
            confirmed.clear()
        elif op == "retry":
            run(port.finish([], ttl, [gate]))
            if live(gate) == SENDING:
                del kv[gate]
        else:
            run(port.release([key]))
            v = live(key)
            if v is not None and v.startswith(port.pending_prefix):
                del kv[key]
                confirmed.pop(port.owner, None)
        assert port.table.get(key) == live(key)
        assert port.table.get(gate) == live(gate)
