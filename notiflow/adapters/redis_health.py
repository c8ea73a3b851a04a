"""What one process's Redis clients have seen lately.

A send flow talks to Redis through three clients (circuit breakers, capacity limiter,
leases), each with its own timeout and its own fallback. When Redis stops answering (a
black hole: no refused connection, only silence), each used to find out on its own, one
timeout after another, while the message in hand waited for all of them. Shared, the first
client to time out marks Redis down for ``hold_s``; the others take their fallbacks at once
until then, and after it the next call of any client asks Redis again. An answer from
Redis clears the mark. :meth:`RedisHealth.ask` is that rule around one call, for clients
with nothing else to decide (the API's admission store and idempotency fences).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from notiflow.adapters.outages import REDIS_DOWN

HOLD_S = 1.0
T = TypeVar("T")


class RedisUnreachable(Exception):
    """Redis failed this call, or another one less than ``hold_s`` ago. ``fresh``: this
    call found it (Redis was not marked down before)."""

    def __init__(self, reason: str, *, fresh: bool) -> None:
        super().__init__(reason)
        self.fresh = fresh


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

    async def ask(self, call: Callable[[], Awaitable[T]], timeout_s: float) -> T:
        """``call``'s answer within ``timeout_s``; :class:`RedisUnreachable` at once while
        down, or when it fails or times out (which marks Redis down)."""
        if self.down:
            raise RedisUnreachable("redis failed recently", fresh=False)
        try:
            answer = await asyncio.wait_for(call(), timeout_s)
        except REDIS_DOWN as exc:  # wait_for's TimeoutError is an OSError
            fresh = not self.down
            self.failed()
            raise RedisUnreachable(f"redis: {type(exc).__name__}", fresh=fresh) from exc
        self.answered()
        return answer
