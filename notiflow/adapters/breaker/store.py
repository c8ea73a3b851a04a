"""The breaker's state in Redis: one Lua script call per batch of ops.

:class:`BreakerStore` runs ``scripts/step.lua`` (the prelude ``LUA_NOW_US``, a blank line,
then the file), which mirrors :func:`~notiflow.adapters.breaker.model.apply`;
:class:`~notiflow.adapters.breaker.model.ModelStore` runs the model itself behind the same
interface (:class:`~notiflow.adapters.breaker.model.BreakerSource`).

Redis key layout (namespace = ``settings.topic_prefix``), one hash per provider account::

    {ns}cb:{provider}  st since until ep why last    state (0 closed, 1 open, 2 half-open), µs
                       fl                            times of the latest failures, "t1,t2,..."
                       head c x s                    newest bucket index; calls, failures, slow
                       b0 .. b{N-1}                  bucket i % N: "i:calls:failures:slow"
                       pn pok psl pl                 probes, fast successes, slow; last admitted
                       w wt wc                       weight (%.17g) at wt; time of last cut
                       n bw                          bucket count and width the counts use
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Final

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from notiflow.adapters.breaker.model import (
    BreakerParams,
    Op,
    Snapshot,
    State,
    StepResult,
    Transition,
)
from notiflow.adapters.redis_pool import LUA_NOW_US, redis_client
from notiflow.settings import Settings

_CODE: dict[State, int] = {State.CLOSED: 0, State.OPEN: 1, State.HALF_OPEN: 2}
"""The hash's ``st`` code of each state."""
_STATE: dict[int, State] = {v: k for k, v in _CODE.items()}

STEP_LUA: Final = LUA_NOW_US + "\n" + (
    resources.files("notiflow.adapters.breaker") / "scripts" / "step.lua"
).read_text(encoding="utf-8")
"""The state machine's script, as registered with Redis (its SHA names it there)."""


class BreakerStore:
    """The Lua state machine over Redis; one instance per worker event loop."""

    def __init__(self, client: aioredis.Redis, params: BreakerParams, namespace: str = "",
                 key_ttl_ms: int = 86_400_000, lane: str = "") -> None:
        longest = max(params.window_us, params.open_us, params.recovery_us) // 1000
        if key_ttl_ms < 2 * longest:
            raise ValueError("key_ttl_ms must be at least twice the longest breaker duration")
        self.r = client
        self.params = params
        self.ns = namespace
        self.lane = lane
        self.key_ttl_ms = key_ttl_ms
        self._args = params.script_args()
        self._script = client.register_script(STEP_LUA)

    @classmethod
    def open(cls, settings: Settings, timeout: float = 0.5, lane: str = "") -> BreakerStore:
        """A store with its own client: short timeouts and no retry (a retried script call
        could count an outcome twice), so an unreachable Redis is noticed within
        ``timeout``. ``lane``: "" for the priority lane's breakers, ``bulk`` for the bulk
        lane's (``adapters/breaker_lanes.py``)."""
        client = redis_client(settings, timeout=timeout,
                              retry=Retry(NoBackoff(), 0), health_check_interval=30)
        return cls(client, BreakerParams.from_settings(settings, lane), settings.topic_prefix,
                   lane=lane)

    def key(self, provider_id: str) -> str:
        """``{ns}cb:{provider}``, or ``{ns}cb:{provider}@{lane}`` for a lane's own breaker."""
        return f"{self.ns}cb:{provider_id}{'@' + self.lane if self.lane else ''}"

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult:
        """Apply ``ops`` in one atomic script call; ``now_us`` overrides Redis's clock."""
        args: list[str | int] = ["" if now_us is None else int(now_us), *self._args,
                                 self.key_ttl_ms, len(ops)]
        for op in ops:
            args += [op.kind, op.verdict.value, int(op.slow), int(op.probe), op.episode,
                     op.reason]
        raw = await self._script(keys=[self.key(provider_id)], args=args)
        return _parse(raw)

    async def aclose(self) -> None:
        await self.r.aclose()


def _text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _parse(raw: list[object]) -> StepResult:
    v = [_text(x) for x in raw]
    ints = [int(x) for x in v[1:5]]
    counts = [int(x) for x in v[6:14]]
    snap = Snapshot(_STATE[ints[0]], ints[1], ints[2], ints[3], v[5], counts[0], counts[1],
                    counts[2], counts[3], counts[4], counts[5], counts[6], counts[7], float(v[14]))
    transitions = tuple(
        Transition(_STATE[int(v[16 + 4 * i])], _STATE[int(v[17 + 4 * i])], int(v[18 + 4 * i]),
                   v[19 + 4 * i])
        for i in range(int(v[15])))
    return StepResult(tuple(ch == "1" for ch in v[0]), snap, transitions)
