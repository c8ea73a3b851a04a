"""What one process's Redis clients have seen lately, and the one rule each of them asks
Redis by.

A send flow talks to Redis through three clients (circuit breakers, capacity limiter,
leases), each with its own timeout and its own fallback. When Redis stops answering (a
black hole: no refused connection, only silence), each would find out on its own, one
timeout after another, while the message in hand waited for all of them. Shared
(:class:`RedisHealth`), the first client to time out marks Redis down for ``hold_s``; the
others take their fallbacks at once until then, and after it the next call of any client
asks Redis again. An answer from Redis clears the mark.

Only a Redis that did not answer (:data:`~notiflow.adapters.outages.REDIS_UNREACHABLE`:
refused, lost, timed out) is down; an error answer (a script failing) is Redis answering.

:class:`RedisGuard` is a client's side of it: the breakers, the limiter and the send step's
dedup calls each keep one. :meth:`RedisHealth.ask` is the rule around one call, for clients
with nothing else to decide (the API's admission store and idempotency fences).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from notiflow.adapters.outages import REDIS_DOWN, REDIS_UNREACHABLE
from notiflow.adapters.ports import Health

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
        down, or when the call fails (a timeout or a lost connection also marks Redis down;
        an error answer does not).

        No probing one call at a time, unlike :class:`RedisGuard`: every call after the
        hold asks, each bounded by ``timeout_s``. Its callers answer API requests, whose
        fallbacks (refuse, or admit unchecked) are not worth taking for the requests that
        arrive while one probe runs on a Redis that is back."""
        if self.down:
            raise RedisUnreachable("redis failed recently", fresh=False)
        try:
            answer = await asyncio.wait_for(call(), timeout_s)
        except REDIS_DOWN as exc:  # wait_for's TimeoutError is an OSError
            unreachable = isinstance(exc, REDIS_UNREACHABLE)
            fresh = unreachable and not self.down
            if unreachable:
                self.failed()
            raise RedisUnreachable(f"redis: {type(exc).__name__}", fresh=fresh) from exc
        self.answered()
        return answer


class RedisGuard:
    """One Redis client's rule for asking Redis, over the process's :class:`RedisHealth`
    (any :class:`~notiflow.adapters.ports.Health`).

    A call that finds Redis unreachable (:meth:`failed`) puts the client off Redis and
    marks the health down. While off, or while the health is down, the client takes its
    fallback without asking (:attr:`asks` False). It asks again by probes, one at a time
    (:meth:`may_probe`, then :meth:`probe_done`), the first ``probe_interval`` after the
    last failure at the earliest (in ``clock``'s unit). An answer (:meth:`answered`) puts it
    back on Redis and clears the health."""

    def __init__(self, health: Health, probe_interval: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.health = health
        self.probe_interval = probe_interval
        self.clock = clock
        self.ok = True
        """Redis answered this client's last call (else it is off Redis)."""
        self.probing = False
        self._next_probe = float("-inf")

    @property
    def asks(self) -> bool:
        """Whether an ordinary call may ask Redis now."""
        return self.ok and not self.health.down

    def may_probe(self) -> bool:
        """Whether to probe now: off Redis, no probe running, the interval over. True
        starts the probe (the caller ends it with :meth:`probe_done`)."""
        if self.ok or self.probing or self.clock() < self._next_probe:
            return False
        self.probing = True
        return True

    def probe_done(self) -> None:
        self.probing = False

    def failed(self, exc: BaseException, at: float | None = None) -> bool:
        """A call or probe failed with ``exc`` (started at ``at``, default now). Redis
        unreachable: the client goes off Redis, the next probe is due ``probe_interval``
        after ``at``, the health is marked down. Any other failure only postpones the next
        probe. True when this call is the one that found Redis unreachable (to log)."""
        self._next_probe = (self.clock() if at is None else at) + self.probe_interval
        if not isinstance(exc, REDIS_UNREACHABLE):
            return False
        found = self.ok
        self.ok = False
        self.health.failed()
        return found

    def answered(self) -> bool:
        """Redis answered: back on Redis, the health cleared. True when the client was off
        Redis until now (to log)."""
        back = not self.ok
        self.ok = True
        self.health.answered()
        return back
