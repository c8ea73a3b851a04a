"""Retry rules as a small value object (DESIGN.md "Tier policy defaults")."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from notiflow.schemas.enums import Tier
from notiflow.settings import Settings


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Either wait until ``next_attempt_at`` and try ``next_attempt``, or give up with
    ``give_up`` (``retries_exhausted`` or ``expires_before_retry``)."""

    next_attempt: int | None
    next_attempt_at: datetime | None
    give_up: str | None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Full-jitter backoff: the wait before attempt ``n + 1`` is ``uniform(0, caps[n - 1])``,
    stretched to a provider's longer Retry-After. ``len(caps) + 1`` attempts in all."""

    caps: tuple[timedelta, ...]

    @classmethod
    def for_tier(cls, settings: Settings, tier: Tier) -> RetryPolicy:
        return cls(tuple(settings.scaled(c) for c in settings.policy(tier).retry_caps))

    @property
    def max_attempts(self) -> int:
        return len(self.caps) + 1

    def after_failure(
        self,
        attempt: int,
        now: datetime,
        expires_at: datetime,
        retry_after: timedelta | None = None,
        rng: random.Random | None = None,
        budget_base: int = 1,
    ) -> RetryDecision:
        """Decide what follows a transient failure of ``attempt``; the budget counts from
        attempt ``budget_base`` (1, or where a DLQ replay started a fresh budget)."""
        n = attempt - budget_base + 1
        if n >= self.max_attempts or n < 1:
            return RetryDecision(None, None, "retries_exhausted")
        cap = self.caps[n - 1]
        wait = timedelta(seconds=(rng or random).uniform(0.0, cap.total_seconds()))
        if retry_after is not None and retry_after > wait:
            wait = retry_after
        due = now + wait
        if due >= expires_at:
            return RetryDecision(None, None, "expires_before_retry")
        return RetryDecision(attempt + 1, due, None)


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
