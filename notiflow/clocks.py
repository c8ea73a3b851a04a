"""A clock a test (or a local run with no real time) moves by hand, to inject wherever code
reads the time through a ``Callable[[], T]``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Generic, TypeVar

T = TypeVar("T")


class ManualClock(Generic[T]):
    """Stands still at ``now`` until moved: by assigning ``now`` (seconds, microseconds or a
    datetime, whatever the code under test reads) or, for a datetime clock, :meth:`advance`."""

    def __init__(self, now: T) -> None:
        self.now = now

    def __call__(self) -> T:
        return self.now

    def advance(self: ManualClock[datetime], by: timedelta | float) -> datetime:
        """Move on by ``by`` (seconds when a float); returns the new time."""
        self.now += by if isinstance(by, timedelta) else timedelta(seconds=by)
        return self.now
