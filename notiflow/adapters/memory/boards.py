"""The boards in memory: each reporter's oldest unsent message per tier and P0's worst
latency, read back as ``adapters/pressure.py`` reads Redis (reports older than
``STALE_AFTER_S`` on the injected clock are ignored)."""

from __future__ import annotations

import threading

from notiflow.adapters.memory.clock import Clock
from notiflow.adapters.pressure import STALE_AFTER_S
from notiflow.schemas.enums import Tier


class BoardTable:
    """What every reporter of the process published."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.backlog: dict[tuple[Tier, str], float | None] = {}
        self.p0: dict[str, tuple[float, float]] = {}
        """reporter → (worst seconds, reported at, epoch seconds)."""
        self.lock = threading.Lock()

    def p0_worst(self) -> float | None:
        now = self.clock().timestamp()
        with self.lock:
            fresh = [w for w, at in self.p0.values() if now - at <= STALE_AFTER_S]
        return max(fresh, default=None)


class MemoryBoards:
    """:class:`~notiflow.adapters.ports.Boards` of one reporter over a :class:`BoardTable`."""

    def __init__(self, table: BoardTable, reporter: str) -> None:
        self.table = table
        self.reporter = reporter

    async def report_backlog(self, tier: Tier, oldest: float | None) -> None:
        with self.table.lock:
            self.table.backlog[(tier, self.reporter)] = oldest

    async def report_p0_worst(self, worst_s: float) -> None:
        t = self.table
        with t.lock:
            t.p0[self.reporter] = (worst_s, t.clock().timestamp())

    async def p0_worst(self) -> float | None:
        return self.table.p0_worst()
