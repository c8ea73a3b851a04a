"""Bulk work yields to P0: an AIMD window driven by the priority lane's latency signal.

The signal (``adapters/pressure.py``) is the worst P0 latency reported in the last second.
:class:`YieldWindow` turns it into the number of bulk operations a process may have in
flight: halved at every tick while the signal is above ``high * SLA``, grown by ``increase *
ceiling`` per tick while it is below ``low * SLA``, held in between; no signal (no P0 traffic)
counts as calm. Additive increase, multiplicative decrease is how TCP shares a link: the bulk
load settles at the level P0 tolerates, and gives way within a second when P0 slows down. Like
TCP it starts slow (``start`` of the ceiling): a bulk flow that starts on a backlog would
otherwise take in its first batches at full width before P0's first report arrives.
:class:`Slots` is the asyncio gate whose limit the window sets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from dataclasses import dataclass
from types import TracebackType

from notiflow.settings import YieldRule


@dataclass(slots=True)
class YieldWindow:
    """The in-flight window of one bulk process (``ceiling``: its configured bound)."""

    rule: YieldRule
    sla_s: float
    ceiling: int
    value: float = 0.0

    def __post_init__(self) -> None:
        self.value = max(float(self.rule.floor), self.rule.start * self.ceiling)

    @property
    def limit(self) -> int:
        return max(self.rule.floor, min(self.ceiling, int(self.value)))

    @property
    def yielding(self) -> bool:
        """Whether the window is below its ceiling."""
        return self.limit < self.ceiling

    def step(self, worst_s: float | None) -> int:
        """One tick with the signal ``worst_s`` (None: no fresh report); the new limit."""
        if not self.rule.enabled:
            self.value = float(self.ceiling)
        elif worst_s is not None and worst_s > self.rule.high * self.sla_s:
            self.value = max(float(self.rule.floor), self.value * self.rule.decrease)
        elif (worst_s is None or worst_s < self.rule.low * self.sla_s
              or self.limit == 0):
            self.value = min(float(self.ceiling), self.value + self.rule.increase * self.ceiling)
        return self.limit


class Slots:
    """An asyncio semaphore whose limit can change while tasks hold or wait for slots
    (lowering it lets the holders finish; nobody new enters until they are below it).
    First come, first served."""

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must not be negative")
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def resize(self, limit: int) -> None:
        self.limit = max(0, limit)
        self._wake()

    async def acquire(self) -> None:
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise

    def release(self) -> None:
        self.used -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.used < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.used += 1
                fut.set_result(None)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
