"""Retry rules as a small value object (docs/design.md, "Retry budgets"; the budgets:
``settings.RetryBudget``)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from notiflow.schemas.enums import Tier
from notiflow.settings import Settings

ZERO = timedelta(0)


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Either wait until ``next_attempt_at`` and try ``next_attempt``, or give up with
    ``give_up`` (``retries_exhausted`` or ``expires_before_retry``). ``failover``: the next
    attempt tries another account first; ``budget_started_at``: when the budget's first
    attempt failed (the retry record carries it to the next decision)."""

    next_attempt: int | None
    next_attempt_at: datetime | None
    give_up: str | None
    failover: bool = False
    budget_started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A tier's budget of ``len(caps) + 1`` attempts. Retry ``n`` (after the budget's
    ``n``-th attempt failed) is due at a uniformly random time in its window
    ``[S(n-1), S(n))`` measured from the budget's first failure, ``S(n)`` the sum of the
    first ``n`` caps: full jitter within each window, so a budget always spans its caps and
    never ends early on lucky draws. A window that began before the failure is drawn from
    what remains of it; one already over (the attempt waited on breakers or a
    ``Retry-After``) is drawn from ``[now, now + cap)``. A provider's longer ``Retry-After``
    wins. Every ``failover_after``-th attempt of the budget moves to the next vendor."""

    caps: tuple[timedelta, ...]
    failover_after: int = 1

    @classmethod
    def for_tier(cls, settings: Settings, tier: Tier) -> RetryPolicy:
        budget = settings.policy(tier).retry
        return cls(tuple(settings.scaled(c) for c in budget.caps), budget.failover_after)

    @property
    def max_attempts(self) -> int:
        return len(self.caps) + 1

    @property
    def span(self) -> timedelta:
        """The latest any attempt of the budget can start after its first failure, when no
        attempt is held back."""
        return sum(self.caps, ZERO)

    def window(self, n: int) -> tuple[timedelta, timedelta]:
        """Retry ``n``'s window (1-based), as offsets from the budget's first failure."""
        lo = sum(self.caps[:n - 1], ZERO)
        return lo, lo + self.caps[n - 1]

    def after_failure(
        self,
        attempt: int,
        now: datetime,
        expires_at: datetime,
        retry_after: timedelta | None = None,
        rng: random.Random | None = None,
        budget_base: int = 1,
        budget_started_at: datetime | None = None,
    ) -> RetryDecision:
        """Decide what follows a transient failure of ``attempt`` at ``now``; the budget
        counts from attempt ``budget_base`` (1, or where a DLQ replay started a fresh one)
        and its windows from ``budget_started_at`` (the first failure of this budget; None
        on a later attempt: its window starts now)."""
        n = attempt - budget_base + 1
        if n >= self.max_attempts or n < 1:
            return RetryDecision(None, None, "retries_exhausted")
        lo, hi = self.window(n)
        anchor = now if n == 1 else budget_started_at or now - lo
        start, end = (max(now, anchor + lo), anchor + hi) if anchor + hi > now else (
            now, now + self.caps[n - 1])
        width = (end - start).total_seconds()
        due = start + timedelta(seconds=(rng or random).uniform(0.0, width))
        if retry_after is not None and now + retry_after > due:
            due = now + retry_after
        if due >= expires_at:
            return RetryDecision(None, None, "expires_before_retry")
        return RetryDecision(attempt + 1, due, None, failover=n % self.failover_after == 0,
                             budget_started_at=anchor)


MAX_PROVIDER_WAITS = 8


def provider_waits(waits: Mapping[str, datetime] | None, provider_id: str,
                   retry_after: timedelta | None, now: datetime) -> dict[str, datetime] | None:
    """A message's ``provider_waits`` after ``provider_id`` answered it with ``retry_after``
    at ``now``: the waits still running, this account's ending at ``now + retry_after`` (or
    later, if it had said so before); None when none is running."""
    kept = {p: until for p, until in (waits or {}).items() if until > now}
    if retry_after is not None and retry_after > timedelta(0):
        kept[provider_id] = max(kept.get(provider_id, now), now + retry_after)
    if len(kept) > MAX_PROVIDER_WAITS:
        kept = dict(sorted(kept.items(), key=lambda kv: kv[1])[-MAX_PROVIDER_WAITS:])
    return kept or None


def waiting(waits: Mapping[str, datetime] | None, provider_id: str, now: datetime) -> bool:
    """Whether ``provider_id``'s ``Retry-After`` for this message is still running."""
    until = (waits or {}).get(provider_id)
    return until is not None and until > now


def held_for(waits: Mapping[str, datetime] | None, candidates: Iterable[str],
             now: datetime) -> timedelta | None:
    """How long ``Retry-After`` holds a message's next attempt: None when one of its
    ``candidates`` (the accounts that can carry it) has no wait running; else until the
    first of their waits ends."""
    ids = list(candidates)
    if not ids or not all(waiting(waits, p, now) for p in ids):
        return None
    return min((waits or {})[p] for p in ids) - now
