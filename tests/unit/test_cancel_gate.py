"""The cancel gate's reference model (``adapters/cancel_gate.py``): a cancel and a send of one
message end in exactly one outcome, whatever order their steps take. The Lua scripts are
checked against this model on real Redis in ``tests/integration/test_redis_cancel_gate.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notiflow.adapters.cancel_gate import (
    CANCELLED,
    MIN_HOLD,
    SENDING,
    GateModel,
    gate_key,
    hold_for,
)
from notiflow.adapters.ports import Confirm

LEASE, GATE, OURS, THEIRS = "lease:m:1", "gate:m", "pending:us:", "pending:them:"
NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def held(owner: str = OURS) -> GateModel:
    m = GateModel()
    m.kv[LEASE] = f"{owner}1"
    return m


def test_cancel_is_idempotent_and_refused_once_sending() -> None:
    m = held()
    assert m.cancel(GATE) and m.cancel(GATE)
    assert m.kv[GATE] == CANCELLED
    assert m.confirm(LEASE, GATE, OURS, f"{OURS}2") is Confirm.CANCELLED
    assert m.kv[LEASE] == f"{OURS}1"

    m = held()
    assert m.confirm(LEASE, GATE, OURS, f"{OURS}2") is Confirm.OURS
    assert (m.kv[LEASE], m.kv[GATE]) == (f"{OURS}2", SENDING)
    assert not m.cancel(GATE)
    assert m.kv[GATE] == SENDING


def test_a_lost_lease_wins_over_the_gate() -> None:
    m = held(THEIRS)
    m.kv[GATE] = CANCELLED
    assert m.confirm(LEASE, GATE, OURS, f"{OURS}2") is Confirm.LOST
    m.kv[LEASE] = 'done:{"status":"SENT"}'
    assert m.confirm(LEASE, GATE, OURS, f"{OURS}2") is Confirm.LOST


def test_a_vanished_lease_is_taken_again() -> None:
    """Redis restarted without the lease (or it expired and nobody took it): nobody else
    sends, so this sender does; a cancel still wins."""
    m = GateModel()
    assert m.confirm("lease:gone:1", GATE, OURS, f"{OURS}2") is Confirm.OURS
    assert (m.kv["lease:gone:1"], m.kv[GATE]) == (f"{OURS}2", SENDING)
    cancelled = GateModel()
    cancelled.kv[GATE] = CANCELLED
    assert cancelled.confirm("lease:gone:1", GATE, OURS, f"{OURS}2") is Confirm.CANCELLED


def test_clear_removes_sending_only() -> None:
    m = held()
    m.confirm(LEASE, GATE, OURS, f"{OURS}2")
    assert m.clear(GATE) and GATE not in m.kv
    assert m.cancel(GATE)
    assert not m.clear(GATE) and m.kv[GATE] == CANCELLED


def test_hold_lasts_a_day_past_expiry_and_at_least_a_minute() -> None:
    assert hold_for(NOW + timedelta(hours=4), NOW) == timedelta(hours=28)
    assert hold_for(NOW - timedelta(days=3), NOW) == MIN_HOLD
    assert hold_for(None, NOW) == timedelta(days=1)
    assert gate_key("t1.", "msg_1") == "t1.gate:msg_1"


Step = tuple[str, int]
steps = st.lists(st.tuples(st.sampled_from(["cancel", "confirm", "retry", "end", "takeover"]),
                           st.integers(0, 1)), max_size=30)


@given(steps)
def test_exactly_one_outcome_in_any_interleaving(seq: list[Step]) -> None:
    """A message's attempts (confirm, then a RETRY_PENDING end that clears the gate or a
    final end that keeps it; a takeover by another sender) interleaved with cancels: no
    attempt is confirmed after a cancel was accepted, and no cancel is accepted while an
    attempt that was confirmed has not ended RETRY_PENDING."""
    m, owners = GateModel(), [OURS, THEIRS]
    m.kv[LEASE] = f"{OURS}0"
    cancelled = sending = False
    for op, who in seq:
        owner = owners[who]
        if op == "cancel":
            ok = m.cancel(GATE)
            assert ok is not sending
            cancelled |= ok
        elif op == "confirm":
            got = m.confirm(LEASE, GATE, owner, f"{owner}1")
            if not m.kv[LEASE].startswith(owner):
                assert got is Confirm.LOST
            elif cancelled:
                assert got is Confirm.CANCELLED
            else:
                assert got is Confirm.OURS
                sending = True
        elif op == "retry" and sending:
            m.clear(GATE)
            sending = False
        elif op == "takeover":
            m.kv[LEASE] = f"{owner}9"
    assert not (cancelled and sending)
