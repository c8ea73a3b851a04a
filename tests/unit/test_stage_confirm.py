"""The Confirm stage on memory ports: the lease still ours and the message not cancelled →
the call goes ahead with the gate ``sending``; lost → nothing; cancelled → CANCELLED."""

from __future__ import annotations

from datetime import timedelta

from notiflow.adapters.cancel_gate import SENDING
from notiflow.adapters.memory.leases import MemoryLeases
from notiflow.flows.send.stages.confirm import Confirm
from notiflow.schemas.campaigns import row_message_id
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import StatusEvent
from tests.unit.memory_send import leased, prepared, run, setup, step, work


def test_ours_goes_ahead_and_the_gate_says_sending_for_the_lease_ttl() -> None:
    s = setup()
    w = work(s)
    leased(s, w)
    assert step(Confirm(), prepared(w), s.ctx) is None
    assert s.state.gate(w.message_id) == SENDING and not s.state.cancel(w.message_id)
    s.clock.advance(s.ctx.lease_ttl(w))
    assert s.state.gate(w.message_id) is None and s.state.cancel(w.message_id)


def test_a_cancelled_message_ends_cancelled_and_its_lease_is_done() -> None:
    s = setup()
    w = work(s)
    leased(s, w)
    assert s.state.cancel(w.message_id)
    outs = step(Confirm(), prepared(w), s.ctx)
    assert [(o.status, o.reason) for o in outs or () if isinstance(o, StatusEvent)] == [
        (Status.CANCELLED, "cancelled")]
    lease = s.state.lease(w.message_id, 1)
    assert lease is not None and lease.startswith("done:")


def test_a_lease_taken_over_by_another_sender_is_lost() -> None:
    s = setup()
    w = work(s)
    leased(s, w)
    other = s.state.open().leases
    assert isinstance(other, MemoryLeases)
    key = s.ctx.lease_key(w)
    holder = s.state.lease(w.message_id, 1)
    assert holder is not None
    s.clock.advance(s.ctx.stale_after(w) + timedelta(seconds=1))
    assert run(other.take_over(key, holder, s.ctx.lease_ttl(w)))
    assert step(Confirm(), prepared(w), s.ctx) == []
    assert s.state.gate(w.message_id) is None


def test_a_vanished_lease_is_taken_again() -> None:
    s = setup()
    w = work(s)
    assert step(Confirm(), prepared(w), s.ctx) is None
    lease = s.state.lease(w.message_id, 1)
    assert lease is not None and lease.startswith(f"pending:{s.ctx.ports.leases.owner}:")


def test_a_cancelled_campaign_stops_its_messages() -> None:
    s = setup()
    campaign = "cmp_" + "c" * 32
    w = work(s, message_id=row_message_id(s.state.keys, campaign, 3))
    leased(s, w)
    s.state.cancel_campaign(campaign)
    outs = step(Confirm(), prepared(w), s.ctx)
    assert [o.status for o in outs or () if isinstance(o, StatusEvent)] == [Status.CANCELLED]
    plain = work(s, 4)
    leased(s, plain)
    assert step(Confirm(), prepared(plain), s.ctx) is None
