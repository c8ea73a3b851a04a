"""Retry rules as a small value object (DESIGN.md "Tier policy defaults")."""

from __future__ import annotations

import random
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
