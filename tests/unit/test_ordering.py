"""Strict ordering per key (``flows/ordering.py``): numbering, and the send step's release
order whatever order messages arrive in, with retries blocking their key only."""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.model import SourceRef, Work
from notiflow.flows.ordering import KeyOrder, OrderedState, Sequence, order_key, sequence_of
from notiflow.schemas.messages import IngestRecord

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
