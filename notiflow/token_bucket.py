"""A token bucket on the caller's clock (pure: no I/O, no clock of its own).

Each call passes ``now`` in seconds from a clock that never goes back (``time.monotonic`` or
a test's); a time before the bucket's last one adds no tokens and does not move it back.
Used where one process limits itself: the capacity limiter's fallback while Redis is down
(``adapters/ratelimit/limiter.py``) and the inbox's connect rate per tenant (``inbox/limits.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """``rate`` tokens a second up to ``burst``; :meth:`take` spends one when there is one."""

    rate: float
    burst: float
    tokens: float
    at: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def _level(self, now: float) -> float:
        if now <= self.at:
            return self.tokens
        return min(self.burst, self.tokens + (now - self.at) * self.rate)

    def peek(self, now: float) -> float:
        """Seconds until a token is there (0 when one is); takes none."""
        tokens = self._level(now)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate

    def take(self, now: float) -> float:
        """Spend a token and return 0, or return the seconds until one is there."""
        if now > self.at:
            self.tokens = self._level(now)
            self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
