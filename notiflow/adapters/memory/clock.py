"""The injected clock of the memory ports: every expiry is read from it, nothing sleeps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]
"""Now, as an aware datetime (the send flow's clock type)."""


def wall() -> datetime:
    return datetime.now(UTC)


def epoch_ms(clock: Clock) -> int:
    return int(clock().timestamp() * 1000)


def epoch_us(clock: Clock) -> int:
    return round(clock().timestamp() * 1_000_000)


class ManualClock:
    """A clock a test moves by hand (:meth:`advance`); starts at ``start``."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta | float) -> datetime:
        """Move on by ``by`` (seconds when a float); returns the new time."""
        self.now += by if isinstance(by, timedelta) else timedelta(seconds=by)
        return self.now
