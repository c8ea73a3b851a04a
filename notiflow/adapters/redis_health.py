"""What one process's Redis clients have seen lately.

A send flow talks to Redis through three clients (circuit breakers, capacity limiter,
leases), each with its own timeout and its own fallback. When Redis stops answering (a
black hole: no refused connection, only silence), each used to find out on its own, one
timeout after another, while the message in hand waited for all of them. Shared, the first
client to time out marks Redis down for ``hold_s``; the others take their fallbacks at once
until then, and after it the next call of any client asks Redis again. An answer from
Redis clears the mark.
"""

from __future__ import annotations

import time
from collections.abc import Callable

HOLD_S = 1.0


class RedisHealth:
    """``failed()`` on a timeout or connection error, ``answered()`` on an answer; ``down``
    while a failure is less than ``hold_s`` old."""

    def __init__(self, hold_s: float = HOLD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self.clock = clock
        self._until = float("-inf")

    @property
    def down(self) -> bool:
        return self.clock() < self._until

    def failed(self) -> None:
        self._until = self.clock() + self.hold_s

    def answered(self) -> None:
        self._until = float("-inf")
