"""Retry rules: full jitter within caps, Retry-After wins, expiry and budget end retries
(the schedules per tier, driven through the clock: ``test_retry_budgets.py``)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notiflow.flows.send.policy import RetryPolicy
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FAR = NOW + timedelta(days=1)


def test_tier_defaults_from_design() -> None:
    s = Settings()
    assert RetryPolicy.for_tier(s, Tier.P0).caps == tuple(
        timedelta(seconds=x) for x in (0, 2))
    assert RetryPolicy.for_tier(s, Tier.P0).failover_after == 2
    assert RetryPolicy.for_tier(s, Tier.P1).max_attempts == 5
    assert RetryPolicy.for_tier(s, Tier.P2).max_attempts == 3
    assert RetryPolicy.for_tier(s, Tier.P3).caps[-1] == timedelta(hours=2)


def test_time_scale_shrinks_caps() -> None:
    s = Settings(time_scale=0.01)
    assert RetryPolicy.for_tier(s, Tier.P1).caps[0] == timedelta(milliseconds=100)


@given(st.integers(1, 4), st.integers(0, 2**32))
def test_wait_bounded_by_cap(attempt: int, seed: int) -> None:
    p = RetryPolicy.for_tier(Settings(), Tier.P1)
    d = p.after_failure(attempt, NOW, FAR, rng=random.Random(seed))
    assert d.next_attempt == attempt + 1
    assert d.next_attempt_at is not None
    assert NOW <= d.next_attempt_at <= NOW + p.caps[attempt - 1]


def test_jitter_spreads_over_the_cap() -> None:
    p = RetryPolicy.for_tier(Settings(), Tier.P2)
    rng = random.Random(7)
    waits = [(p.after_failure(1, NOW, FAR, rng=rng).next_attempt_at - NOW).total_seconds()
             for _ in range(2000)]
    assert min(waits) < 180 and max(waits) > 1620
    assert 720 < sum(waits) / len(waits) < 1080


def test_retry_after_wins_when_longer() -> None:
    p = RetryPolicy.for_tier(Settings(), Tier.P1)
    d = p.after_failure(1, NOW, FAR, retry_after=timedelta(seconds=60), rng=random.Random(1))
    assert d.next_attempt_at == NOW + timedelta(seconds=60)


def test_budget_exhausted_and_expiry() -> None:
    p = RetryPolicy.for_tier(Settings(), Tier.P1)
    assert p.after_failure(5, NOW, FAR).give_up == "retries_exhausted"
    soon = NOW + timedelta(milliseconds=1)
    d = p.after_failure(1, NOW, soon, retry_after=timedelta(seconds=1))
    assert d.give_up == "expires_before_retry" and d.next_attempt is None


@given(st.integers(1, 50), st.integers(0, 2**32))
def test_replayed_budget_counts_from_its_base(base: int, seed: int) -> None:
    """A DLQ replay starts a fresh budget at ``budget_base``: the same caps, the same number
    of attempts, whatever attempt number it starts from."""
    p = RetryPolicy.for_tier(Settings(), Tier.P1)
    rng = random.Random(seed)
    attempt, waits = base, []
    while True:
        d = p.after_failure(attempt, NOW, FAR, rng=rng, budget_base=base)
        if d.give_up:
            assert d.give_up == "retries_exhausted"
            break
        assert d.next_attempt == attempt + 1 and d.next_attempt_at is not None
        waits.append(d.next_attempt_at - NOW)
        attempt += 1
    assert attempt - base + 1 == p.max_attempts
    assert all(w <= cap for w, cap in zip(waits, p.caps, strict=True))


def test_attempt_below_its_base_never_retries() -> None:
    p = RetryPolicy.for_tier(Settings(), Tier.P1)
    assert p.after_failure(3, NOW, FAR, budget_base=5).give_up == "retries_exhausted"


def test_every_exhausted_budget_is_dead_lettered_an_expiry_only_when_unexplained() -> None:
    from notiflow.flows.send.stages.classifying import EXHAUSTED, UNEXPLAINED, exhaustion_letter

    for reason in ("server_error", "rate_limited", None, "connect_error", "timeout"):
        assert exhaustion_letter("retries_exhausted", reason) == EXHAUSTED
    assert exhaustion_letter("retries_exhausted", "internal_error:KeyError") == UNEXPLAINED
    assert exhaustion_letter("expires_before_retry", "internal_error:KeyError") == UNEXPLAINED
    assert exhaustion_letter("expires_before_retry", "connect_error") == EXHAUSTED
    assert exhaustion_letter("expires_before_retry", "timeout") == EXHAUSTED
    for answered in ("server_error", "rate_limited", None):
        assert exhaustion_letter("expires_before_retry", answered) is None
