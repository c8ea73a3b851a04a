"""Strict ordering per key (``flows/send/ordering.py``): numbering, and the send step's release
order whatever order messages arrive in, with retries blocking their key only."""

from __future__ import annotations

import concurrent.futures
import itertools
import pickle
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.send.dispatch import SendLogic
from notiflow.flows.send.ordering import (
    OVERFLOW_REASON,
    KeyOrder,
    OrderedState,
    Sequence,
    order_key,
    past,
    refused_events,
    sequence_of,
    with_number,
)
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.settings import Settings

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def work(i: int, *, seq: str | None = None, attempt: int = 1, key: str = "k") -> Work:
    rec = IngestRecord.model_validate({
        "channel": "SMS", "tier": "P1", "recipient": f"+1415555{i:04d}", "tenant_id": "acme",
        "template_id": "t", "template_version": 1, "message_id": f"msg_{key}{i}",
        "accepted_at": T0.isoformat(), "ordering_key": key, "attempt": attempt,
        "order_seq": seq})
    return Work(rec, SourceRef("t", 0, i), b"", None)


def numbered(n: int, epoch: str = "e1", attempt: int = 1) -> Work:
    return work(n, seq=f"{epoch}:{n}", attempt=attempt)


def test_order_key_names_tier_channel_tenant_and_key() -> None:
    assert order_key(work(1).record) == "order:P1:SMS:acme:k"
    unordered = work(1).record.model_copy(update={"ordering_key": None})
    assert order_key(unordered) is None


def test_sequence_numbers_first_records_and_lets_retries_keep_theirs() -> None:
    now = [T0]
    seq = Sequence(None, lambda: now[0], timedelta(minutes=5))
    out = [next(iter(seq.on_item(work(i))[0])) for i in range(1, 4)]
    epochs = {sequence_of(w)[0] for w in out}
    assert [sequence_of(w)[1] for w in out] == [1, 2, 3] and len(epochs) == 1
    retry = out[1].record.model_copy(update={"attempt": 2})
    [again], _ = seq.on_item(Work(retry, out[1].source, b"", None))
    assert again.record.order_seq == out[1].record.order_seq
    assert seq.notify_at() == T0 + timedelta(minutes=5)
    now[0] = T0 + timedelta(minutes=6)
    _, keep = seq.on_notify()
    assert keep is Sequence.DISCARD
    [fresh], _ = Sequence(None, lambda: now[0], timedelta(minutes=5)).on_item(work(9))
    assert sequence_of(fresh)[0] not in epochs and sequence_of(fresh)[1] == 1


@given(st.permutations(list(range(1, 9))), st.sets(st.integers(1, 8)))
def test_release_follows_numbers_whatever_the_arrival_order(arrival: list[int],
                                                             skipped: set[int]) -> None:
    order = KeyOrder()
    sent: list[int] = []
    in_flight: list[Work] = []
    for n in arrival:
        w = numbered(n)
        released = order.skip(w) if n in skipped else order.offer(w)
        in_flight += released
        while in_flight:
            head = in_flight.pop(0)
            sent.append(sequence_of(head)[1])
            in_flight += order.ended(head, retried=False)
    assert sent == sorted(set(arrival) - skipped)
    assert order.idle()


def test_a_retried_head_blocks_its_key_until_its_next_record_ends() -> None:
    order = KeyOrder()
    [first] = order.offer(numbered(1))
    assert order.offer(numbered(2)) == [] and order.offer(numbered(3)) == []
    assert order.ended(first, retried=True) == []
    assert not order.idle()
    retry = numbered(1, attempt=2)
    assert order.offer(retry) == [retry]
    [second] = order.ended(retry, retried=False)
    assert sequence_of(second)[1] == 2
    [third] = order.ended(second, retried=False)
    assert sequence_of(third)[1] == 3


def test_a_skip_of_the_awaited_message_moves_the_key_on() -> None:
    order = KeyOrder()
    [first] = order.offer(numbered(1))
    order.offer(numbered(2))
    order.ended(first, retried=True)
    [second] = order.skip(numbered(1, attempt=2))
    assert sequence_of(second)[1] == 2


def test_copies_wait_with_their_number_and_ended_numbers_pass() -> None:
    order = KeyOrder()
    [first] = order.offer(numbered(1))
    assert order.offer(numbered(2)) == []
    assert order.offer(numbered(2)) == []
    copies = order.ended(first, retried=False)
    assert [sequence_of(w)[1] for w in copies] == [2, 2]
    late = numbered(1)
    assert order.offer(late) == [late]


def test_a_new_epoch_waits_until_the_old_one_has_nothing_waiting() -> None:
    order = KeyOrder()
    [first] = order.offer(numbered(1))
    order.offer(numbered(2))
    assert order.offer(numbered(1, epoch="e2")) == []
    [second] = order.ended(first, retried=False)
    [new] = order.ended(second, retried=False)
    assert sequence_of(new) == ("e2", 1)


def test_state_survives_a_snapshot() -> None:
    order = KeyOrder()
    [first] = order.offer(numbered(1))
    order.offer(numbered(3))
    order.offer(numbered(2))
    restored: OrderedState = pickle.loads(pickle.dumps(OrderedState(order, [first])))
    [second] = restored.order.ended(restored.in_flight[0], retried=False)
    assert sequence_of(second)[1] == 2


def test_a_blocked_key_holds_at_most_its_cap_and_fails_the_rest_in_order() -> None:
    order = KeyOrder(cap=3)
    [first] = order.offer(numbered(1))
    assert order.ended(first, retried=True) == []
    for n in range(2, 1002):
        assert order.offer(numbered(n)) == []
    assert sorted(order.waiting) == [2, 3, 4]
    assert order.passed == ((5, 1001),)
    events = refused_events(order, T0)
    assert len(events) == 997 and order.refused == ()
    assert {(e.status, e.reason) for e in events} == {(Status.FAILED, OVERFLOW_REASON)}
    assert [e.message_id for e in events[:2]] == ["msg_k5", "msg_k6"]
    retry = numbered(1, attempt=2)
    assert order.offer(retry) == [retry]
    sent = []
    head = retry
    while released := order.ended(head, retried=False):
        [head] = released
        sent.append(sequence_of(head)[1])
    assert sent == [2, 3, 4]
    late = numbered(1002)
    assert order.offer(late) == [late]


def test_suppressions_behind_a_blocked_head_cost_one_range() -> None:
    order = KeyOrder()
    [first] = order.offer(numbered(1))
    order.ended(first, retried=True)
    for n in range(2, 5_002):
        order.skip(numbered(n))
    assert order.passed == ((2, 5_001),) and not order.skipped
    [again] = order.offer(numbered(1, attempt=2))
    assert order.ended(again, retried=False) == []
    assert order.next == 5_002 and order.passed == ()


def test_a_newer_epoch_over_the_cap_is_refused_and_passed_after_the_switch() -> None:
    order = KeyOrder(cap=2)
    [first] = order.offer(numbered(1))
    order.offer(numbered(2))
    assert order.offer(numbered(1, epoch="e2")) == []
    assert order.offer(numbered(2, epoch="e2")) == []
    assert [w.record.order_seq for w in order.refused] == ["e2:2"]
    [second] = order.ended(first, retried=False)
    [new] = order.ended(second, retried=False)
    assert sequence_of(new) == ("e2", 1)
    assert order.ended(new, retried=False) == []
    third = numbered(3, epoch="e2")
    assert order.offer(third) == [third]


@given(st.lists(st.integers(0, 60), max_size=40), st.integers(0, 70))
def test_ranges_hold_exactly_the_numbers_put_in(numbers: list[int], start: int) -> None:
    ranges: tuple[tuple[int, int], ...] = ()
    for n in numbers:
        ranges = with_number(ranges, n)
    held = {n for lo, hi in ranges for n in range(lo, hi + 1)}
    assert held == set(numbers)
    assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(ranges))
    n, rest = past(ranges, start)
    expected = start
    while expected in held:
        expected += 1
    assert n == expected
    assert {m for lo, hi in rest for m in range(lo, hi + 1)} == {m for m in held if m > n}


class _Blocked:
    """A dispatcher whose attempts never end (the head waits for a breaker)."""

    def __init__(self, cap: int) -> None:
        self.settings = Settings(ordering_max_waiting=cap)
        self.submitted: list[Work] = []

    def submit(self, works: list[Work]) -> list[concurrent.futures.Future[list[Any]]]:
        self.submitted += works
        return [concurrent.futures.Future() for _ in works]


def test_the_send_step_answers_an_overflow_with_failed_events() -> None:
    dispatcher = _Blocked(cap=2)
    logic = SendLogic(cast(Any, dispatcher), None)
    outs, _ = logic.on_batch([numbered(n) for n in range(1, 6)])
    assert [sequence_of(w)[1] for w in dispatcher.submitted] == [1]
    failed = [o for o in outs if isinstance(o, StatusEvent)]
    assert [(e.message_id, e.status, e.reason) for e in failed] == [
        ("msg_k4", Status.FAILED, OVERFLOW_REASON), ("msg_k5", Status.FAILED, OVERFLOW_REASON)]
    snapshot = logic.snapshot()
    assert isinstance(snapshot, OrderedState) and sorted(snapshot.order.waiting) == [2, 3]
