"""Breaker lanes against real Redis: bulk evidence opens only the bulk lane's breaker, a
priority outage stops bulk too, and a bulk process watching the priority breaker never takes
its probes (``adapters/breaker_lanes.py``)."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from notiflow.adapters.breaker import AdmissionKind, BreakerParams, State, StateChange
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.breaker.store import BreakerStore
from notiflow.adapters.breaker_lanes import BulkBreakers
from notiflow.adapters.providers.base import Outcome
from notiflow.settings import BreakerRule
from tests.fakes import ManualClock

pytestmark = pytest.mark.integration

S = 1_000_000
T0 = 1_700_000_000_000_000
PARAMS = BreakerParams.from_rule(BreakerRule())


def lanes(url: str, clock: ManualClock[int]) -> tuple[CircuitBreakers, BulkBreakers, str]:
    ns = f"lanes{uuid.uuid4().hex[:10]}."

    def store(lane: str) -> BreakerStore:
        return BreakerStore(aioredis.Redis.from_url(url, decode_responses=True), PARAMS, ns,
                            600_000, lane=lane)

    priority = CircuitBreakers(store(""), clock_us=clock, cache_ttl=0)
    bulk = BulkBreakers(CircuitBreakers(store("bulk"), clock_us=clock, cache_ttl=0, lane="bulk"),
                        CircuitBreakers(store(""), clock_us=clock, cache_ttl=0))
    return priority, bulk, ns


async def fail(breakers: CircuitBreakers | BulkBreakers, n: int, clock: ManualClock[int]) -> None:
    for _ in range(n):
        await breakers.record("tw", Outcome.AMBIGUOUS, "timeout", 5.0)
        clock.now += 1000


async def test_bulk_failures_open_only_the_bulk_lane(redis_url: str) -> None:
    clock = ManualClock(T0)
    priority, bulk, ns = lanes(redis_url, clock)
    changes: list[StateChange] = []
    bulk.on_change(changes.append)
    await fail(bulk, 5, clock)
    assert (await bulk.allow("tw")).kind is AdmissionKind.REFUSED
    assert (await priority.allow("tw")).kind is AdmissionKind.NORMAL
    assert bulk.state("tw") is State.OPEN and priority.state("tw") is State.CLOSED
    assert [(c.lane, c.new) for c in changes] == [("bulk", State.OPEN)]
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    keys = sorted([k async for k in client.scan_iter(match=f"{ns}*")])
    assert keys == [f"{ns}cb:tw", f"{ns}cb:tw@bulk"]
    await client.aclose()
    await priority.aclose()
    await bulk.aclose()


async def test_a_priority_outage_stops_bulk_and_its_probes_stay_with_priority(
        redis_url: str) -> None:
    clock = ManualClock(T0)
    priority, bulk, _ = lanes(redis_url, clock)
    await fail(priority, 5, clock)
    refused = await bulk.allow("tw")
    assert refused.kind is AdmissionKind.REFUSED and refused.retry_in > 59
    assert bulk.state("tw") is State.OPEN

    clock.now = T0 + 61 * S
    for _ in range(30):
        assert (await bulk.allow("tw")).kind is AdmissionKind.NORMAL
        clock.now += 1000
    assert priority.state("tw") is State.HALF_OPEN
    assert (await priority.allow("tw")).kind is AdmissionKind.PROBE
    await priority.aclose()
    await bulk.aclose()
