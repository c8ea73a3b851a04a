"""``CircuitBreakers`` over the reference model's store, without Redis: the cached state and
its staleness, shared script calls, deferred successes, the state machine through the API,
the route weight, the local breaker while the store is unreachable and its convergence, and
the stream of changes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from notiflow.adapters.breaker import (
    AdmissionKind,
    BreakerParams,
    ModelStore,
    Op,
    State,
    StateChange,
    StepResult,
)
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.settings import BreakerRule
from tests.fakes import ManualClock
from tests.helpers import first_changes, loop_turns, wait_until

T0 = 1_700_000_000_000_000
S = 1_000_000
DEFAULT = BreakerParams.from_rule(BreakerRule())


class FlakyStore(ModelStore):
    def __init__(self, params: BreakerParams, clock: ManualClock[int]) -> None:
        super().__init__(params, clock)
        self.down = False
        self.calls: list[int] = []

    async def run(self, provider_id: str, ops: Sequence[Op],
                  now_us: int | None = None) -> StepResult:
        if self.down:
            raise RedisConnectionError("connection refused")
        self.calls.append(len(ops))
        await loop_turns()
        return await super().run(provider_id, ops, now_us)


def breakers(p: BreakerParams = DEFAULT) -> tuple[CircuitBreakers, FlakyStore, ManualClock[int]]:
    clock = ManualClock(T0)
    store = FlakyStore(p, clock)
    return CircuitBreakers(store, clock_us=clock), store, clock


async def test_allow_answers_from_the_cache_until_it_is_stale() -> None:
    cb, store, clock = breakers()
    assert (await cb.allow("tw")).kind is AdmissionKind.NORMAL
    for _ in range(100):
        await cb.allow("tw")
        clock.now += 1000
    assert store.calls == [1]
    clock.now += 100_000
    await cb.allow("tw")
    assert store.calls == [1, 1]


async def test_concurrent_records_share_script_calls() -> None:
    cb, store, _ = breakers()
    states = await asyncio.gather(*(cb.record("tw", Outcome.TRANSIENT, "rate_limited", 0.1)
                                    for _ in range(100)))
    assert set(states) == {State.CLOSED}
    assert sum(store.calls) == 100 and len(store.calls) <= 2


async def test_successes_are_deferred_and_ride_with_the_next_call_in_order() -> None:
    cb, store, _ = breakers()
    for _ in range(19):
        assert await cb.record("tw", Outcome.ACCEPTED, None, 0.1) is State.CLOSED
    assert cb.stats.deferred == 19 and sum(store.calls) <= 19
    for _ in range(3):
        await cb.record("tw", Outcome.TRANSIENT, "server_error", 0.1)
    snap = cb.snapshot("tw")
    assert snap is not None and (snap.calls, snap.failures) == (22, 3)
    assert cb.state("tw") is State.CLOSED and len(store.calls) <= 4
    await cb.record("tw", Outcome.PERMANENT, "invalid_recipient", 0.1)
    await cb.flush("tw")
    snap = cb.snapshot("tw")
    assert snap is not None and snap.calls == 23


async def test_deferred_successes_flush_on_their_own() -> None:
    clock = ManualClock(T0)
    store = FlakyStore(DEFAULT, clock)
    cb = CircuitBreakers(store, clock_us=clock, flush_interval=0.01)
    await cb.record("tw", Outcome.ACCEPTED, None, 0.1)
    assert store.calls == []
    await wait_until(lambda: store.calls, timeout=1.0, what="the deferred flush")
    assert store.calls == [1]


async def test_opens_probes_and_closes_through_the_api() -> None:
    cb, _, clock = breakers()
    changes: list[StateChange] = []
    cb.on_change(changes.append)
    for _ in range(4):
        assert await cb.record("tw", Outcome.TRANSIENT, "server_error", 0.1) is State.CLOSED
    assert await cb.record("tw", Outcome.AMBIGUOUS, "timeout", 2.0) is State.OPEN
    refused = await cb.allow("tw")
    assert refused.kind is AdmissionKind.REFUSED and refused.retry_in == 60.0
    clock.now += 60 * S
    assert cb.state("tw") is State.HALF_OPEN
    first = await cb.allow("tw")
    assert first.kind is AdmissionKind.PROBE and first.episode == 1
    kinds = [(await cb.allow("tw")).kind for _ in range(39)]
    assert kinds.count(AdmissionKind.PROBE) == 2
    assert [i for i, k in enumerate(kinds, 2) if k is AdmissionKind.PROBE] == [20, 40]
    for _ in range(19):
        await cb.record_result(SendResult(Outcome.ACCEPTED, "tw", datetime.now(UTC),
                                          datetime.now(UTC), "SM1"), first)
    assert cb.state("tw") is State.HALF_OPEN
    assert await cb.record("tw", Outcome.ACCEPTED, None, 0.1, True, episode=1) is State.CLOSED
    assert (await cb.allow("tw")).kind is AdmissionKind.NORMAL
    assert [(c.old, c.new, c.why) for c in changes] == [
        (State.CLOSED, State.OPEN, "failures:5"),
        (State.OPEN, State.HALF_OPEN, "open_elapsed"),
        (State.HALF_OPEN, State.CLOSED, "probes_ok:20/20")]
    assert changes[1].at_us == changes[0].at_us + 60 * S and all(c.shared for c in changes)
    assert changes[0].at == datetime.fromtimestamp(changes[0].at_us / S, UTC)


async def test_throttling_lowers_the_weight_only() -> None:
    cb, _, clock = breakers()
    assert cb.weight("tw") == 1.0
    for _ in range(10):
        assert await cb.record("tw", Outcome.TRANSIENT, "rate_limited", 0.05) is State.CLOSED
    assert cb.weight("tw") == 0.5
    clock.now += 15 * S
    assert cb.weight("tw") == 0.75
    await cb.record("tw", Outcome.TRANSIENT, "rate_limited", 0.05)
    assert cb.weight("tw") == 0.375
    clock.now += 60 * S
    assert cb.weight("tw") == 1.0


async def test_redis_down_local_breaker_then_converge(caplog: pytest.LogCaptureFixture) -> None:
    cb, store, clock = breakers()
    changes: list[StateChange] = []
    cb.on_change(changes.append)
    await cb.record("tw", Outcome.ACCEPTED, None, 0.1)
    store.down = True
    with caplog.at_level(logging.WARNING, "notiflow.adapters.breaker"):
        for _ in range(5):
            await cb.record("tw", Outcome.TRANSIENT, "server_error", 0.1)
            clock.now += 1000
        assert not cb.redis_ok and cb.state("tw") is State.OPEN
        assert (await cb.allow("tw")).kind is AdmissionKind.REFUSED
        clock.now += S
        assert (await cb.allow("tw")).kind is AdmissionKind.REFUSED
    assert sum("unreachable" in r.message for r in caplog.records) == 1
    assert [(c.new, c.shared) for c in changes] == [(State.OPEN, False)]
    assert cb.stats.local_ops >= 6
    store.down = False
    clock.now += S
    await cb.allow("tw")
    await wait_until(lambda: cb.redis_ok, timeout=1.0, what="the background probe")
    assert cb.redis_ok and cb.state("tw") is State.CLOSED
    assert (await cb.allow("tw")).kind is AdmissionKind.NORMAL
    assert [(c.old, c.new, c.why) for c in changes[1:]] == [
        (State.OPEN, State.CLOSED, "converged")]


async def test_local_breaker_starts_from_the_last_shared_state() -> None:
    cb, store, clock = breakers()
    for _ in range(5):
        await cb.record("tw", Outcome.TRANSIENT, "server_error", 0.1)
    store.down = True
    clock.now += 30 * S
    assert (await cb.allow("tw")).kind is AdmissionKind.REFUSED
    clock.now += 30 * S
    assert (await cb.allow("tw")).kind is AdmissionKind.PROBE
    assert not cb.redis_ok


async def test_changes_iterator() -> None:
    cb, _, _ = breakers()
    task = first_changes(cb, 1)
    await loop_turns()
    for _ in range(5):
        await cb.record("tw", Outcome.TRANSIENT, "server_error", 0.1)
    received = await asyncio.wait_for(task, 1)
    assert [(c.provider_id, c.new) for c in received] == [("tw", State.OPEN)]
