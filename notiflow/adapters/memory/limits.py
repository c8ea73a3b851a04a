"""Circuit breakers and capacity tokens in memory: the reference models (``breaker/model.py``,
``ratelimit/model.py``) behind the same facades the real ports use.

A :class:`SharedBreakerModel` (one per lane) and a :class:`SharedDecisions` hold the state
every sender of the process shares, as the Redis hashes do; each opened port set wraps them
in its own :class:`~notiflow.adapters.breaker.CircuitBreakers` (or the bulk lane's
:class:`~notiflow.adapters.breaker_lanes.BulkBreakers`) and
:class:`~notiflow.adapters.ratelimit.CapacityLimiter`, all driven by the injected clock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from notiflow.adapters.breaker import (
    BreakerParams,
    ModelState,
    Op,
    State,
    StepResult,
    Verdict,
    run_model,
)
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.breaker_lanes import BULK, BulkBreakers
from notiflow.adapters.memory.clock import Clock, epoch_us
from notiflow.adapters.ports import Breakers
from notiflow.adapters.ratelimit import (
    CapacityLimiter,
    CapacityRules,
    Decision,
    Request,
    decide,
)
from notiflow.adapters.ratelimit import ModelStore as DecisionModel
from notiflow.adapters.redis_health import RedisHealth
from notiflow.settings import Settings


class SharedBreakerModel:
    """A :class:`~notiflow.adapters.breaker.BreakerSource` running the breaker model under
    a lock, on the injected clock (``now_us`` of a driven facade wins)."""

    def __init__(self, params: BreakerParams, clock: Clock) -> None:
        self.params = params
        self.clock = clock
        self.states: dict[str, ModelState] = {}
        self._lock = threading.Lock()

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult:
        return self.step(provider_id, ops, now_us)

    def step(self, provider_id: str, ops: Sequence[Op], now_us: int | None = None) -> StepResult:
        with self._lock:
            state = self.states.setdefault(provider_id, ModelState())
            return run_model(state, self.params, ops,
                             epoch_us(self.clock) if now_us is None else now_us)

    def trip(self, provider_id: str) -> State:
        """Open ``provider_id``'s breaker as ``failure_threshold`` failures at once do."""
        fail = Op("r", Verdict.FAILURE, reason="server_error")
        return self.step(provider_id, [fail] * self.params.failure_threshold).snapshot.state

    async def aclose(self) -> None:
        return None


class SharedDecisions:
    """A :class:`~notiflow.adapters.ratelimit.DecisionSource` running the capacity model
    under a lock, on the injected clock."""

    def __init__(self, rules: CapacityRules, clock: Clock) -> None:
        self.rules = rules
        self.model = DecisionModel(rules, lambda: epoch_us(clock))
        self._lock = threading.Lock()

    async def request(self, provider_id: str, request: Request,
                      now_us: int | None = None) -> Decision:
        self.rules.provider(provider_id)
        now = self.model.clock_us() if now_us is None else now_us
        with self._lock:
            return decide(self.model.states[provider_id], request, now)

    async def aclose(self) -> None:
        return None


class Limits:
    """The breaker and capacity state shared by the port sets of one process."""

    def __init__(self, settings: Settings, clock: Clock) -> None:
        self.clock = clock
        self.breakers = {lane: SharedBreakerModel(BreakerParams.from_settings(settings, lane),
                                                  clock) for lane in ("", BULK)}
        self.decisions = SharedDecisions(CapacityRules.from_settings(settings), clock)

    def open_breakers(self, lane: str, health: RedisHealth) -> Breakers:
        """The facade a sender of ``lane`` asks (the bulk lane's also follows the priority
        lane's breakers, as ``breaker_lanes.lane_breakers`` does)."""
        def facade(source: SharedBreakerModel, name: str) -> CircuitBreakers:
            return CircuitBreakers(source, clock_us=lambda: epoch_us(self.clock), lane=name,
                                   health=health)

        priority = facade(self.breakers[""], "")
        if lane == BULK:
            return BulkBreakers(facade(self.breakers[BULK], BULK), priority)
        return priority

    def open_quota(self, workers: int, health: RedisHealth) -> CapacityLimiter:
        return CapacityLimiter(self.decisions, expected_workers=workers,
                               clock=lambda: self.clock().timestamp(), health=health)
