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
    for terminal in (Status.FAILED, Status.EXPIRED, Status.SUPPRESSED, Status.PROVIDER_ACCEPTED):
        assert rank(terminal) > rank(Status.UNKNOWN, 99_999)


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
