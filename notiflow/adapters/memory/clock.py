"""The injected clock of the memory ports: every expiry is read from it, nothing sleeps."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]
"""Now, as an aware datetime (the send flow's clock type)."""


def wall() -> datetime:
    return datetime.now(UTC)


def epoch_ms(clock: Clock) -> int:
    return int(clock().timestamp() * 1000)


def epoch_us(clock: Clock) -> int:
    return round(clock().timestamp() * 1_000_000)

