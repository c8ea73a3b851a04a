"""The capacity limiter against real Redis: the Lua script decides exactly as the Python
reference model, keeps every 1 s window under the contracted rate (driven time and real
time, two limiters at once), and the Redis-down policies hold.

Uses the shared local Redis when it answers (``NOTIFLOW_REDIS_URL`` or the default), else a
private ``redis-server``; every test has its own key namespace, so runs never collide.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notiflow.adapters.ratelimit import (
    TIERS,
    CapacityLimiter,
    CapacityRules,
    CapacityStore,
    Decision,
    ModelState,
    ProviderRule,
    Request,
    decide,
)
from notiflow.flows.send.routing import Choice, rank_routes, reserve
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import ProviderRoute, Settings
from tests.fakes import ManualClock
from tests.helpers import granted_over, hold_async, loop_turns, max_window, wait_until
from tests.integration.conftest import RedisServer

pytestmark = pytest.mark.integration

W = 1_000_000
T0 = 1_000_000_000
SHARES = (0.2, 0.25, 0.25, 0.3)


def namespace() -> str:
    return f"rl{uuid.uuid4().hex[:10]}."


def rules_for(*providers: ProviderRule) -> CapacityRules:
    return CapacityRules({p.provider_id: p for p in providers},
                         {t: Settings().policy(t).redis_down for t in TIERS})


# Lua == model, and the window bound, with driven time ---------------------------------------

step_st = st.tuples(
    st.integers(0, 150_000), st.sampled_from(TIERS), st.integers(1, 40),
    st.sampled_from([(None, None), ("a", 4.5), ("b", 60.0), ("c", 0.5)]))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rate=st.sampled_from([50.0, 57.5, 100.0, 333.0]),
       emergency=st.sampled_from([0.0, 0.5, 12.0]),
       steps=st.lists(step_st, min_size=1, max_size=60))
async def test_lua_decides_exactly_like_the_model(
        client: aioredis.Redis, rate: float, emergency: float,
        steps: list[tuple[int, Tier, int, tuple[str | None, float | None]]]) -> None:
    rule = ProviderRule("p", rate, SHARES, emergency)
    store = CapacityStore(client, rules_for(rule), namespace())
    model = ModelState(rule)
    at = T0
    grants: list[tuple[int, int]] = []
    for dt, tier, n, (tenant, trate) in steps:
        at += dt
        req = Request(tier, n, tenant, trate)
        got = await store.request("p", req, now_us=at)
        assert got == decide(model, req, at)
        grants.append((got.now_us, got.granted - got.emergency))
    assert max_window(grants, W) <= rate


async def test_long_trace_matches_the_model_and_the_window_sums(
        client: aioredis.Redis) -> None:
    """Hundreds of entries per window: the wait search reads the logs in chunks."""
    rule = ProviderRule("p", 120.0, SHARES, 6.0)
    ns = namespace()
    store = CapacityStore(client, rules_for(rule), ns)
    model = ModelState(rule)
    rnd = random.Random(7)
    at = T0
    for _ in range(800):
        at += rnd.randint(0, 2500)
        req = Request(rnd.choice(TIERS), rnd.randint(1, 6))
        assert await store.request("p", req, now_us=at) == decide(model, req, at)
    meta = await client.hgetall(f"{ns}cap:p:meta")
    for h, tier in enumerate(TIERS):
        members = [str(m) for m in await client.zrange(f"{ns}cap:p:log:{tier.value}", 0, -1)]
        assert len(members) > 64
        assert int(meta[f"d{h}"]) == sum(int(m.split(":")[1]) for m in members)
        assert int(meta[f"g{h}"]) == sum(int(m.split(":")[2]) for m in members)


async def test_key_layout_and_expiry(client: aioredis.Redis) -> None:
    ns = namespace()
    store = CapacityStore(client, rules_for(ProviderRule("tw", 100.0, SHARES, 5.0)), ns)
    d = await store.request("tw", Request(Tier.P0, 40, "acme", 30.0), now_us=T0)
    assert (d.granted, d.emergency) == (25, 5)
    await store.request("tw", Request(Tier.P3, 5), now_us=T0 + 10)
    assert await client.zrange(f"{ns}cap:tw:log:P0", 0, -1, withscores=True) == [
        ("1:30:20", float(T0))]
    assert await client.zrange(f"{ns}cap:tw:em", 0, -1) == ["2:5"]
    assert await client.zrange(f"{ns}cap:tw:log:P3", 0, -1) == ["3:5:5"]
    meta = await client.hgetall(f"{ns}cap:tw:meta")
    assert {k: meta[k] for k in ("g0", "d0", "g3", "d3", "em", "seq", "last")} == {
        "g0": "20", "d0": "30", "g3": "5", "d3": "5", "em": "5", "seq": "3",
        "last": str(T0 + 10)}
    assert float((await client.hgetall(f"{ns}cap:tenant:acme"))["tokens"]) == 5.0
    for key in store.provider_keys("tw"):
        ttl = await client.pttl(key)
        assert ttl == -2 or 0 < ttl <= store.key_ttl_ms
    assert 0 < await client.pttl(f"{ns}cap:tenant:acme") <= store.key_ttl_ms + 1000
    late = await store.request("tw", Request(Tier.P3, 1), now_us=T0 + W + 10)
    assert late.granted == 1
    assert await client.zrange(f"{ns}cap:tw:log:P0", 0, -1) == []


async def test_redis_clock_is_used_without_now(client: aioredis.Redis) -> None:
    store = CapacityStore(client, rules_for(ProviderRule("tw", 100.0, SHARES)), namespace())
    before = time.time_ns() // 1000
    d = await store.request("tw", Request(Tier.P3, 1))
    assert d.granted == 1 and abs(d.now_us - before) < 5_000_000


# saturating clients with driven time ---------------------------------------------------------


async def simulate(store: CapacityStore, clients: list[tuple[Tier, int, int, int]],
                   horizon_us: int) -> list[tuple[int, Tier, int]]:
    """Clients ``(tier, lease, start_us, token_us)`` that always want more; refused ones
    sleep the returned wait."""
    heap = [(T0 + start, i) for i, (_, _, start, _) in enumerate(clients)]
    heapq.heapify(heap)
    out: list[tuple[int, Tier, int]] = []
    while heap:
        at, i = heapq.heappop(heap)
        if at > T0 + horizon_us:
            continue
        tier, lease, _, token_us = clients[i]
        d = await store.request("p", Request(tier, lease), now_us=at)
        if d.granted:
            out.append((d.now_us - T0, tier, d.granted - d.emergency))
        heapq.heappush(heap, (at + (d.granted * token_us if d.granted else d.wait_us), i))
    return out


def window(points: list[tuple[int, int]], end: int) -> int:
    return sum(k for at, k in points if end - W < at <= end)


async def test_p3_alone_gets_at_least_90_percent(client: aioredis.Redis) -> None:
    rate = 300.0
    store = CapacityStore(client, rules_for(ProviderRule("p", rate, SHARES)), namespace())
    grants = await simulate(store, [(Tier.P3, 9, i * 700, 2000) for i in range(3)], 3 * W)
    assert sum(k for *_, k in grants) >= 0.9 * rate * 3
    assert max_window([(at, k) for at, _, k in grants], W) <= rate


async def test_p0_takes_its_share_back_from_saturating_p3(client: aioredis.Redis) -> None:
    rate = 300.0
    rule = ProviderRule("p", rate, SHARES)
    store = CapacityStore(client, rules_for(rule), namespace())
    s0, lease, start = rule.capacities[0], 6, 2 * W
    clients = [(Tier.P3, 9, i * 700, 9000) for i in range(3)]
    clients += [(Tier.P0, lease, start + i * 300, 100) for i in range(2)]
    grants = await simulate(store, clients, 4 * W)
    p0 = [(at, k) for at, tier, k in grants if tier is Tier.P0]
    p3 = [(at, k) for at, tier, k in grants if tier is Tier.P3]
    assert window(p3, start) >= 0.9 * rate
    for end in range(start + W + 100_000, 4 * W, 20_000):
        assert window(p0, end) >= math.floor(s0) - lease
        assert window(p0, end) + window(p3, end) <= rate


# P0 routing across provider accounts (flows/send/routing.py reserve) -----------------------------


async def test_p0_moves_to_the_second_provider_once_the_firsts_share_is_spent(
        client: aioredis.Redis) -> None:
    ns = namespace()
    rules = rules_for(ProviderRule("tw", 10.0, SHARES), ProviderRule("vo", 10.0, SHARES))
    limiter = CapacityLimiter(CapacityStore(client, rules, ns))
    routes = rank_routes((ProviderRoute(provider_id="vo", channel=Channel.SMS, reliability=0.99),
                          ProviderRoute(provider_id="tw", channel=Channel.SMS,
                                        reliability=0.995)),
                         tier=Tier.P0, channel=Channel.SMS, recipient="+14155550123",
                         enabled=frozenset({"tw", "vo"}))

    async def no_wait(seconds: float) -> None:
        raise AssertionError(f"P0 waited {seconds} s while a provider had a token")

    async def p0(sleep: Callable[[float], Awaitable[None]]) -> str:
        choice = await reserve(routes, None, limiter, Tier.P0, sleep=sleep)
        assert isinstance(choice, Choice)
        return choice.provider_id

    assert [await p0(no_wait) for _ in range(4)] == ["tw", "tw", "vo", "vo"]
    meta = await client.hgetall(f"{ns}cap:tw:meta")
    assert (int(meta["g0"]), int(meta["d0"])) == (2, 3)

    waits: list[float] = []

    async def wait(seconds: float) -> None:
        waits.append(seconds)
        await hold_async(seconds)

    started = time.monotonic()
    assert await p0(wait) == "tw"
    assert 0 < sum(waits) <= 1.0 and time.monotonic() - started < 1.5


# two limiters ("processes") in real time ----------------------------------------------------


class RecordingStore(CapacityStore):
    def __init__(self, client: aioredis.Redis, rules: CapacityRules, ns: str) -> None:
        super().__init__(client, rules, ns)
        self.decisions: list[Decision] = []

    async def request(self, provider_id: str, request: Request,
                      now_us: int | None = None) -> Decision:
        d = await super().request(provider_id, request, now_us)
        self.decisions.append(d)
        return d


async def test_two_limiters_never_exceed_the_rate_in_real_time(redis_url: str) -> None:
    rate, seconds = 200.0, 3.0
    rules = rules_for(ProviderRule("conc", rate, SHARES))
    ns = namespace()
    stores = [RecordingStore(aioredis.Redis.from_url(redis_url, decode_responses=True),
                             rules, ns) for _ in range(2)]
    limiters = [CapacityLimiter(s) for s in stores]
    taken: list[float] = []
    stop = time.monotonic() + seconds

    async def worker(limiter: CapacityLimiter, tier: Tier) -> None:
        while time.monotonic() < stop:
            wait = await limiter.acquire("conc", tier)
            if wait is None:
                taken.append(time.monotonic())
                await loop_turns()
            else:
                await hold_async(min(wait, stop - time.monotonic()))

    await asyncio.gather(*(worker(limiters[0], Tier.P3) for _ in range(4)),
                         *(worker(limiters[1], t) for t in (Tier.P3, Tier.P3, Tier.P1)))
    for limiter in limiters:
        await limiter.aclose()
    grants = [(d.now_us, d.granted) for s in stores for d in s.decisions]
    assert max_window(grants, W) <= rate
    leases = 6 + 6 + 5
    assert max_window([(int(t * 1e6), 1) for t in taken], W) <= rate + leases
    assert len(taken) >= 0.8 * rate * seconds
    assert sum(len(s.decisions) for s in stores) < len(taken)


# Redis down ----------------------------------------------------------------------------------


async def test_redis_down_local_keeps_granting_pause_waits_then_recovers(
        caplog: pytest.LogCaptureFixture, private_redis: RedisServer) -> None:
    clock = ManualClock(1000.0)
    s = Settings(redis_url=private_redis.url, provider_rates={"down": 1000.0},
                 topic_prefix=namespace())
    limiter = CapacityLimiter(s, clock=clock)
    assert await limiter.acquire("down", Tier.P0) is None
    assert await limiter.acquire("down", Tier.P2) is None
    private_redis.stop()
    with caplog.at_level(logging.WARNING, "notiflow.adapters.ratelimit"):
        granted = await granted_over(limiter, "down", Tier.P0, clock, 1000)
        assert await limiter.acquire("down", Tier.P2) == 0.5
        assert await limiter.acquire("down", Tier.P3) == 0.5
    assert not limiter.redis_ok
    local_rate = 0.5 * 0.2 * 1000.0
    assert local_rate <= granted <= local_rate + local_rate * 0.25 + 1
    assert sum("unreachable" in r.message for r in caplog.records) == 1

    private_redis.start()
    async def probed() -> bool:
        if limiter.redis_ok:
            return True
        clock.now += 0.5
        assert await limiter.acquire("down", Tier.P2) == 0.5, "P2 waits until the probe answers"
        return False

    await wait_until(probed, timeout=5, interval=0.1, what="the background probe")
    assert limiter.redis_ok, "the background probe found Redis again"
    assert await limiter.acquire("down", Tier.P2) is None
    assert await limiter.acquire("down", Tier.P0) is None
    await limiter.aclose()
