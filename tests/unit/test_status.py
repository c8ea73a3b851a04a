"""The status order: merging is max, so out-of-order input never regresses a status."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.schemas.enums import Status
from notiflow.schemas.status import OFFSET_CLASS_US, rank, supersedes, write_offset_us

IN_FLIGHT = [Status.PROCESSING, Status.RETRY_PENDING, Status.UNKNOWN]
events = st.lists(st.tuples(st.sampled_from(list(Status)), st.integers(0, 20)), min_size=1,
                  max_size=12)


def merge(seq: list[tuple[Status, int]]) -> tuple[Status, int]:
    current = seq[0]
    for s, a in seq[1:]:
        if supersedes(s, a, *current):
            current = (s, a)
    return current


@given(events, st.randoms())
def test_result_is_independent_of_arrival_order(seq: list[tuple[Status, int]], rnd) -> None:
    shuffled = list(seq)
    rnd.shuffle(shuffled)
    assert rank(*merge(seq)) == rank(*merge(shuffled))


@given(events)
def test_never_regresses(seq: list[tuple[Status, int]]) -> None:
    current = seq[0]
    for s, a in seq[1:]:
        before = rank(*current)
        if supersedes(s, a, *current):
            current = (s, a)
        assert rank(*current) >= before


@given(events)
def test_duplicates_are_harmless(seq: list[tuple[Status, int]]) -> None:
    assert rank(*merge(seq)) == rank(*merge(seq + seq))


@pytest.mark.parametrize(("later", "earlier"), [
    (Status.SENT, Status.DELIVERED),
    (Status.FAILED, Status.DELIVERED),
    (Status.QUEUED, Status.PROVIDER_ACCEPTED),
    (Status.PROCESSING, Status.PROVIDER_ACCEPTED),
    (Status.RETRY_PENDING, Status.FAILED),
    (Status.EXPIRED, Status.PROVIDER_ACCEPTED),
    (Status.DELIVERED, Status.OPENED),
    (Status.CANCELLED, Status.PROVIDER_ACCEPTED),
    (Status.CANCELLED, Status.FAILED),
    (Status.QUEUED, Status.CANCELLED),
    (Status.RETRY_PENDING, Status.CANCELLED),
    (Status.UNKNOWN, Status.CANCELLED),
    (Status.EXPIRED, Status.CANCELLED),
    (Status.SUPPRESSED, Status.CANCELLED),
])
def test_forbidden_regressions(later: Status, earlier: Status) -> None:
    assert not supersedes(later, 1, earlier, 1)


@pytest.mark.parametrize(("new", "old"), [
    (Status.BOUNCED, Status.DELIVERED),
    (Status.FAILED, Status.SENT),
    (Status.DELIVERED, Status.FAILED),
    (Status.PROVIDER_ACCEPTED, Status.UNKNOWN),
    (Status.EXPIRED, Status.RETRY_PENDING),
    (Status.QUEUED, Status.SCHEDULED),
    (Status.CANCELLED, Status.SCHEDULED),
    (Status.CANCELLED, Status.QUEUED),
    (Status.CANCELLED, Status.RETRY_PENDING),
    (Status.CANCELLED, Status.EXPIRED),
    (Status.CANCELLED, Status.SUPPRESSED),
    (Status.PROVIDER_ACCEPTED, Status.CANCELLED),
])
def test_allowed_progress(new: Status, old: Status) -> None:
    assert supersedes(new, 1, old, 1)


def test_attempts_order_in_flight_statuses() -> None:
    assert supersedes(Status.PROCESSING, 2, Status.RETRY_PENDING, 1)
    assert not supersedes(Status.PROCESSING, 1, Status.RETRY_PENDING, 1)
    assert supersedes(Status.UNKNOWN, 1, Status.RETRY_PENDING, 1)
    for a, b in itertools.pairwise(IN_FLIGHT):
        assert rank(b, 3) > rank(a, 3)


def test_terminal_outcomes_outrank_any_attempt() -> None:
    for terminal in (Status.FAILED, Status.EXPIRED, Status.SUPPRESSED, Status.PROVIDER_ACCEPTED,
                     Status.CANCELLED):
        assert rank(terminal) > rank(Status.UNKNOWN, 99_999)


STORED_RANKS = {
    Status.CREATED: 0, Status.SCHEDULED: 1_000_000, Status.QUEUED: 2_000_000,
    Status.SUPPRESSED: 4_000_000, Status.EXPIRED: 5_000_000,
    Status.PROVIDER_ACCEPTED: 6_000_000, Status.SENT: 7_000_000, Status.FAILED: 8_000_000,
    Status.DELIVERED: 9_000_000, Status.BOUNCED: 10_000_000, Status.OPENED: 11_000_000,
    Status.CLICKED: 12_000_000,
}


def test_ranks_stored_in_cassandra_never_change() -> None:
    assert {s: rank(s) for s in STORED_RANKS} == STORED_RANKS
    assert (rank(Status.PROCESSING, 7), rank(Status.RETRY_PENDING, 7),
            rank(Status.UNKNOWN, 7)) == (3_000_070, 3_000_071, 3_000_072)


def test_cancelled_sits_at_the_top_of_expired_class_with_an_exact_offset() -> None:
    assert rank(Status.EXPIRED) < rank(Status.CANCELLED) < rank(Status.PROVIDER_ACCEPTED)
    assert rank(Status.CANCELLED, 42) == rank(Status.CANCELLED) == 5_000_000 + OFFSET_CLASS_US - 1
    offset = write_offset_us(rank(Status.CANCELLED))
    assert offset == 6 * OFFSET_CLASS_US - 1
    assert write_offset_us(rank(Status.EXPIRED)) == 5 * OFFSET_CLASS_US
    assert write_offset_us(rank(Status.UNKNOWN, 999)) < offset


def test_attempt_bounds() -> None:
    with pytest.raises(ValueError):
        rank(Status.PROCESSING, 100_000)


@given(st.tuples(st.sampled_from(list(Status)), st.integers(0, 999)),
       st.tuples(st.sampled_from(list(Status)), st.integers(0, 999)))
def test_write_offsets_keep_the_order_and_stay_small(a: tuple[Status, int],
                                                     b: tuple[Status, int]) -> None:
    ra, rb = rank(*a), rank(*b)
    oa, ob = write_offset_us(ra), write_offset_us(rb)
    assert oa is not None and ob is not None
    assert (oa < ob) == (ra < rb) and (oa == ob) == (ra == rb)
    assert 0 <= oa <= 13 * OFFSET_CLASS_US


def test_in_flight_ranks_beyond_attempt_999_have_no_offset() -> None:
    assert write_offset_us(rank(Status.PROCESSING, 1000)) is None
    assert write_offset_us(rank(Status.DELIVERED)) == 9 * OFFSET_CLASS_US
