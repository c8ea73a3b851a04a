"""The priority lane's latency signal, by which bulk work yields to P0 at the shared bottlenecks.

Every process on P0's path (the priority-lane API, the P0 send flow) reports four times a
second the worst P0 latency it sees: the slowest acceptance → provider latency completed in
the last second, or the age of the oldest P0 message it still holds (a stall shows while it
lasts, not after). Bulk processes read the worst fresh report and yield by it
(``flows/common/yielding.py``): the bulk send flows narrow their in-flight windows, the bulk-lane
API refuses new bulk acceptances, the reconciler applies bulk writes behind priority ones.

Redis hash ``{prefix}pressure:P0``: field = reporter id, value = JSON ``{"worst_s": seconds,
"reported_at": epoch seconds}``. Reports older than :data:`STALE_AFTER_S` are ignored, so no
P0 traffic (or a stopped reporter) means no pressure.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import orjson
import redis.asyncio as aioredis

STALE_AFTER_S = 2.0
FORGET_AFTER_S = 60.0
"""Reports this old are deleted by the reader that finds them (a reporter that stopped)."""
REPORT_EVERY_S = 0.25
WINDOW_S = 1.0


def pressure_key(prefix: str) -> str:
    return f"{prefix}pressure:P0"


class LatencyWindow:
    """The P0 latencies a process completed in the last ``window_s`` (injected clock)."""

    def __init__(self, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._seen: collections.deque[tuple[float, float]] = collections.deque()

    def add(self, latency_s: float) -> None:
        self._seen.append((self.clock(), latency_s))

    def worst(self, holding_s: float | None = None) -> float | None:
        """The slowest latency of the window, or ``holding_s`` (the oldest message still
        held) when that is worse; None when there is neither."""
        cutoff = self.clock() - self.window_s
        while self._seen and self._seen[0][0] < cutoff:
            self._seen.popleft()
        seen = max((lat for _, lat in self._seen), default=None)
        if holding_s is None:
            return seen
        return holding_s if seen is None else max(seen, holding_s)


async def report(client: aioredis.Redis, prefix: str, reporter: str, worst_s: float,
                 now: float | None = None) -> None:
    """Publish this reporter's worst P0 latency."""
    value = orjson.dumps({"worst_s": worst_s, "reported_at": time.time() if now is None
                          else now})
    key = pressure_key(prefix)
    pipe = client.pipeline(transaction=False)
    pipe.hset(key, reporter, value)
    pipe.expire(key, int(STALE_AFTER_S * 30))
    await pipe.execute()


async def worst(client: aioredis.Redis, prefix: str, now: float | None = None) -> float | None:
    """The worst P0 latency over fresh reports (None: no fresh report)."""
    now = time.time() if now is None else now
    key = pressure_key(prefix)
    raw = await client.hgetall(key)
    out: float | None = None
    gone = []
    for field, value in raw.items():
        doc = orjson.loads(value)
        age = now - float(doc["reported_at"])
        if age > STALE_AFTER_S:
            if age > FORGET_AFTER_S:
                gone.append(field)
            continue
        w = float(doc["worst_s"])
        out = w if out is None else max(out, w)
    if gone:
        await client.hdel(key, *gone)
    return out
