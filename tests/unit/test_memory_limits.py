"""The memory breakers and capacity tokens: the reference models behind the real facades,
shared by every port set of the process, on the injected clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notiflow.adapters.breaker import BreakerParams, ModelStore, Op, State, Verdict
from notiflow.adapters.memory import memory_ports
from notiflow.adapters.memory.limits import SharedBreakerModel, SharedDecisions
from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.ratelimit import CapacityRules, Request
from notiflow.adapters.ratelimit import ModelStore as DecisionModel
from notiflow.schemas.enums import Tier
from tests.fakes import ManualClock
from tests.helpers import memory_settings

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
US0 = int(T0.timestamp()) * 1_000_000
OPS = st.sampled_from([Op("k"), Op("n"), Op("g"), Op("r", Verdict.SUCCESS),
                       Op("r", Verdict.FAILURE, reason="server_error"),
                       Op("r", Verdict.THROTTLED, reason="rate_limited"),
                       Op("r", Verdict.SUCCESS, slow=True, probe=True)])


@given(st.lists(st.tuples(OPS, st.integers(0, 20_000_000)), max_size=60))
def test_the_shared_breaker_steps_like_the_model(steps: list[tuple[Op, int]]) -> None:
    params = BreakerParams.from_settings(memory_settings())
    clock = ManualClock(T0)
    shared, model = SharedBreakerModel(params, clock), ModelStore(params, lambda: 0)
    for op, dt in steps:
        clock.advance(timedelta(microseconds=dt))
        now = US0 + round((clock() - T0) / timedelta(microseconds=1))
        got = asyncio.run(shared.run("twilio", [op]))
        assert got == asyncio.run(model.run("twilio", [op], now))


@given(st.lists(st.tuples(st.sampled_from(list(Tier)), st.integers(1, 3),
                          st.integers(0, 400_000)), max_size=60))
def test_the_shared_decisions_decide_like_the_model(
        steps: list[tuple[Tier, int, int]]) -> None:
    rules = CapacityRules.from_settings(memory_settings())
    clock = ManualClock(T0)
    shared, model = SharedDecisions(rules, clock), DecisionModel(rules, lambda: 0)
    for tier, n, dt in steps:
        clock.advance(timedelta(microseconds=dt))
        now = US0 + round((clock() - T0) / timedelta(microseconds=1))
        request = Request(tier, n, "acme", 5.0)
        got = asyncio.run(shared.request("vonage", request))
        assert got == asyncio.run(model.request("vonage", request, now))


def test_an_opened_breaker_refuses_then_probes_when_its_time_is_up() -> None:
    settings = memory_settings()
    clock = ManualClock(T0)
    state, _ = memory_ports(settings, Tier.P1, clock=clock)
    assert state.open_breaker("twilio") is State.OPEN
    ports = state.open()
    refused = asyncio.run(ports.breakers.allow("twilio"))
    assert not refused.admitted and refused.retry_in > 0
    assert asyncio.run(ports.breakers.allow("vonage")).admitted
    clock.advance(settings.scaled(settings.breaker.open_for))
    assert asyncio.run(state.open().breakers.allow("twilio")).probe


def test_failures_recorded_by_one_port_set_open_the_breaker_for_another() -> None:
    settings = memory_settings()
    clock = ManualClock(T0)
    state, _ = memory_ports(settings, Tier.P1, clock=clock)
    a, b = state.open(), state.open()

    async def fail() -> None:
        for _ in range(settings.breaker.failure_threshold):
            await a.breakers.record("vonage", Outcome.TRANSIENT, "server_error", 0.01)

    asyncio.run(fail())
    assert not asyncio.run(b.breakers.allow("vonage")).admitted


def test_bulk_lane_breakers_follow_the_priority_lane() -> None:
    state, _ = memory_ports(memory_settings(), Tier.P3)
    state.open_breaker("twilio")
    assert not asyncio.run(state.open().breakers.allow("twilio")).admitted
    state.open_breaker("vonage", "bulk")
    assert not asyncio.run(state.open().breakers.allow("vonage")).admitted
    assert asyncio.run(state.open(tier=Tier.P1).breakers.allow("vonage")).admitted


def test_capacity_is_counted_across_port_sets_and_refills_with_the_clock() -> None:
    settings = memory_settings(provider_rates={**memory_settings().provider_rates,
                                               "vonage": 10.0})
    clock = ManualClock(T0)
    state, _ = memory_ports(settings, Tier.P1, clock=clock)
    a, b = state.open(), state.open()

    async def take(n: int) -> list[float | None]:
        return [await (a, b)[i % 2].quota.acquire("vonage", Tier.P3) for i in range(n)]

    got = asyncio.run(take(30))
    assert got.count(None) <= 10 and any(w is not None for w in got)
    clock.advance(2.0)
    assert asyncio.run(a.quota.acquire("vonage", Tier.P3)) is None
