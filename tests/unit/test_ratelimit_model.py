"""The capacity decision (reference model) and the worker-side limiter, without Redis.

Properties, over any interleaving of requests (random times, sizes, tiers, tenants):

(a) regular grants in every window ``(g - W, g]`` ending at a grant ``g`` total at most ``R``
    (emergency grants at most ``E``) — so every 1 s window does;
(b) if P0's demand in ``(g - W, g]`` was at least ``S_0`` at every lower-tier grant ``g`` in
    ``(T - W, T]``, a P0 request of ``n`` at ``T`` gets exactly ``min(n, ⌊S_0 - G_0⌋)``
    regular tokens, ``G_0`` = P0's grants in ``(T - W, T]`` before it: P0 is cut short only
    once it holds its whole share. With saturating clients, P0 holds at least
    ``⌊S_0⌋ - lease`` in every window from ~1 s after it starts competing with saturating P3;
(c) P3 alone (saturating clients) is granted at least 90 % of ``R`` over a few seconds;
plus: the returned wait is exact (denied just before it, granted at it).
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import heapq
import logging
import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError

from notiflow.adapters.ratelimit import (
    CapacityLimiter,
    CapacityRules,
    CapacityStore,
    Decision,
    ModelState,
    ModelStore,
    ProviderRule,
    Request,
    decide,
)
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.fakes import ManualClock
from tests.helpers import granted_over, loop_turns, max_window

W = 1_000_000
T0 = 5_000_000
DEFAULT_SHARES = (0.2, 0.25, 0.25, 0.3)


@dataclass(frozen=True)
class Step:
    at_us: int
    request: Request
    decision: Decision


@st.composite
def rules(draw: st.DrawFn) -> ProviderRule:
    rate = draw(st.sampled_from([50.0, 57.5, 100.0, 333.0, 1000.0]))
    if draw(st.booleans()):
        shares = DEFAULT_SHARES
    else:
        weights = draw(st.lists(st.integers(1, 10), min_size=4, max_size=4))
        shares = tuple(w / sum(weights) for w in weights)  # type: ignore[assignment]
    emergency = draw(st.sampled_from([0.0, 0.5, 3.0, 25.0]))
    return ProviderRule("p", rate, shares, emergency)  # type: ignore[arg-type]


@st.composite
def traces(draw: st.DrawFn, tenants: bool = True, p0_weight: int = 1,
           max_size: int = 150) -> tuple[ProviderRule, list[tuple[int, Request]]]:
    rule = draw(rules())
    tiers = st.sampled_from([Tier.P0] * p0_weight + [Tier.P1, Tier.P2, Tier.P3])
    tenant = st.sampled_from([(None, None), ("a", 4.5), ("b", 60.0), ("c", 0.5)]
                             if tenants else [(None, None)])
    max_n = max(2, math.floor(rule.rate * 0.25))
    raw = draw(st.lists(st.tuples(st.integers(0, 120_000), tiers, st.integers(1, max_n),
                                  tenant), min_size=1, max_size=max_size))
    at, out = T0, []
    for dt, tier, n, (tid, trate) in raw:
        at += dt
        out.append((at, Request(tier, n, tid, trate)))
    return rule, out


def run(rule: ProviderRule, trace: list[tuple[int, Request]]) -> list[Step]:
    state = ModelState(rule)
    return [Step(at, req, decide(state, req, at)) for at, req in trace]


def window_sum(points: list[tuple[int, int]], end: int) -> int:
    """Sum of ``k`` over points (sorted by time) in ``(end - W, end]``."""
    times = [at for at, _ in points]
    lo, hi = bisect.bisect_right(times, end - W), bisect.bisect_right(times, end)
    return sum(k for _, k in points[lo:hi])


def check_window_bound(steps: list[Step], rule: ProviderRule) -> None:
    regular = [(s.decision.now_us, s.decision.granted - s.decision.emergency) for s in steps]
    emergency = [(s.decision.now_us, s.decision.emergency) for s in steps]
    assert max_window(regular, W) <= rule.rate
    assert max_window(emergency, W) <= rule.emergency_rate


# rules from settings -----------------------------------------------------------------------


def test_rules_from_settings_defaults() -> None:
    s = Settings(time_scale=0.01, provider_rates={"twilio": 1000.0, "vonage": 80.0},
                 p0_emergency_rate=50.0)
    r = CapacityRules.from_settings(s)
    twilio = r.provider("twilio")
    assert twilio.capacities == (200.0, 250.0, 250.0, 300.0)
    assert twilio.prefix == (200.0, 450.0, 700.0, 1000.0)
    assert twilio.emergency_rate == 50.0 and twilio.window_us == W
    assert r.provider("vonage").rate == 80.0
    assert r.redis_down[Tier.P0] == "local" and r.redis_down[Tier.P3] == "pause"
    assert r.local_rate_fraction == 0.5
    with pytest.raises(ValueError, match="no contracted rate"):
        r.provider("nope")


@pytest.mark.parametrize("kwargs", [
    {"rate": 0.0},
    {"shares": (0.2, 0.2, 0.2, 0.2)},
    {"shares": (0.5, 0.5, -0.1, 0.1)},
    {"rate": 4.0},
    {"emergency_rate": -1.0},
])
def test_rule_validation(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"provider_id": "p", "rate": 100.0, "shares": DEFAULT_SHARES}
    with pytest.raises(ValueError):
        ProviderRule(**{**base, **kwargs})  # type: ignore[arg-type]


def test_request_validation() -> None:
    with pytest.raises(ValueError):
        Request(Tier.P0, 0)
    with pytest.raises(ValueError):
        Request(Tier.P0, 1, "t", 0.0)


# the decision ------------------------------------------------------------------------------


GRANTS: dict[str, list[tuple[Tier, int, int, int]]] = {
    "borrowing-is-downward-only-p0": [(Tier.P0, 100, 0, 20)],
    "borrowing-is-downward-only-p1": [(Tier.P1, 100, 0, 45), (Tier.P3, 100, 0, 55)],
    "double-borrowing-does-not-eat-a-lower-reservation": [
        (Tier.P1, 100, 0, 45), (Tier.P2, 100, 0, 25), (Tier.P3, 100, 0, 30)],
    "higher-tier-demand-holds-its-reservation-back": [
        (Tier.P3, 100, 0, 100), (Tier.P0, 15, W // 2, 0), (Tier.P3, 100, W, 85),
        (Tier.P0, 15, W, 15)],
}
"""``(tier, count, at - T0, granted)`` of each request in turn, on a fresh 100/s provider
with the default shares."""


@pytest.mark.parametrize("steps", list(GRANTS.values()), ids=list(GRANTS))
def test_grants_in_turn(steps: list[tuple[Tier, int, int, int]]) -> None:
    state = ModelState(ProviderRule("p", 100.0, DEFAULT_SHARES))
    granted = [decide(state, Request(tier, n), T0 + at).granted for tier, n, at, _ in steps]
    assert granted == [g for *_, g in steps]


def test_p0_emergency_quota_is_extra_and_p0_only() -> None:
    rule = ProviderRule("p", 100.0, DEFAULT_SHARES, emergency_rate=10.0)
    state = ModelState(rule)
    d = decide(state, Request(Tier.P0, 50), T0)
    assert (d.granted, d.emergency) == (30, 10)
    assert decide(state, Request(Tier.P3, 100), T0).granted == 80
    d = decide(state, Request(Tier.P0, 1), T0 + 10)
    assert d.granted == 0 and d.wait_us == W - 10


def test_tenant_bucket_charges_together() -> None:
    rule = ProviderRule("p", 100.0, DEFAULT_SHARES)
    state = ModelState(rule)
    assert decide(state, Request(Tier.P3, 10, "t", 4.0), T0).granted == 4
    d = decide(state, Request(Tier.P3, 10, "t", 4.0), T0)
    assert d.granted == 0 and d.wait_us == 250_001
    assert decide(state, Request(Tier.P3, 10, "t", 4.0), T0 + 250_001).granted == 1
    assert decide(state, Request(Tier.P3, 10), T0 + 250_001).granted == 10
    assert state.demand[3] == 4 + 1 + 10


def test_time_never_goes_backwards() -> None:
    state = ModelState(ProviderRule("p", 100.0, DEFAULT_SHARES))
    assert decide(state, Request(Tier.P3, 1), T0).now_us == T0
    assert decide(state, Request(Tier.P3, 1), T0 - 10).now_us == T0


@settings(max_examples=300, deadline=None)
@given(traces())
def test_a_no_window_exceeds_the_rate(case: tuple[ProviderRule, list[tuple[int, Request]]]
                                      ) -> None:
    rule, trace = case
    steps = run(rule, trace)
    check_window_bound(steps, rule)
    for s in steps:
        d, r = s.decision, s.request
        assert 0 <= d.emergency <= d.granted <= r.n
        assert (d.granted == 0) == (d.wait_us > 0)
        assert d.emergency == 0 or r.tier is Tier.P0


@settings(max_examples=200, deadline=None)
@given(traces())
def test_wait_is_exact(case: tuple[ProviderRule, list[tuple[int, Request]]]) -> None:
    rule, trace = case
    state = ModelState(rule)
    for at, req in trace:
        before = copy.deepcopy(state)
        d = decide(state, req, at)
        if d.granted:
            continue
        later = copy.deepcopy(before)
        assert decide(later, req, at + d.wait_us).granted >= 1
        if not req.tenant_limited and d.wait_us > 1:
            sooner = copy.deepcopy(before)
            assert decide(sooner, req, at + d.wait_us - 1).granted == 0


@settings(max_examples=200, deadline=None)
@given(traces(tenants=False))
def test_room_is_what_the_tier_could_still_take_now(
        case: tuple[ProviderRule, list[tuple[int, Request]]]) -> None:
    rule, trace = case
    state = ModelState(rule)
    for at, req in trace:
        d = decide(state, req, at)
        probe = copy.deepcopy(state)
        big = Request(req.tier, 10 * int(rule.rate) + 10)
        taken = decide(probe, big, d.now_us)
        assert d.room >= 0
        assert taken.granted - taken.emergency == d.room


@settings(max_examples=300, deadline=None)
@given(traces(tenants=False, p0_weight=4))
def test_b_p0_is_cut_short_only_at_its_share(
        case: tuple[ProviderRule, list[tuple[int, Request]]]) -> None:
    rule, trace = case
    s0 = rule.capacities[0]
    steps = run(rule, trace)
    regular = [(s.decision.now_us, s.decision.granted - s.decision.emergency) for s in steps]
    p0_demand: list[tuple[int, int]] = []
    lower_grants: list[tuple[int, int]] = []
    p0_grants: list[tuple[int, int]] = []
    for s, (at, k_reg) in zip(steps, regular, strict=True):
        if s.request.tier is Tier.P0:
            held_before = window_sum(p0_grants, at)
            recent = [d0 for g, d0 in lower_grants if at - W < g <= at]
            if all(d0 >= s0 for d0 in recent):
                event("P0 request after lower-tier grants, all guarded" if recent
                      else "P0 request, no lower-tier grant in the window")
                if recent and k_reg < s.request.n:
                    event("... and cut short at its share")
                assert k_reg == min(s.request.n, math.floor(s0 - held_before))
            p0_demand.append((at, s.request.n))
            p0_grants.append((at, k_reg))
        elif k_reg:
            lower_grants.append((at, window_sum(p0_demand, at)))


# saturating clients ------------------------------------------------------------------------


@dataclass(frozen=True)
class Client:
    tier: Tier
    lease: int
    start_us: int = 0
    token_us: int = 0
    jitter_us: int = 0


def simulate(rule: ProviderRule, clients: list[Client], horizon_us: int
             ) -> list[tuple[int, Tier, int]]:
    """Clients that always want more: spend a grant (``token_us`` per token), then ask
    again; on a refusal, sleep the returned wait (+ ``jitter_us``)."""
    state = ModelState(rule)
    heap = [(c.start_us, i) for i, c in enumerate(clients)]
    heapq.heapify(heap)
    grants: list[tuple[int, Tier, int]] = []
    while heap:
        at, i = heapq.heappop(heap)
        if at > horizon_us:
            continue
        c = clients[i]
        d = decide(state, Request(c.tier, c.lease), at)
        if d.granted:
            grants.append((d.now_us, c.tier, d.granted - d.emergency))
            heapq.heappush(heap, (at + d.granted * c.token_us, i))
        else:
            heapq.heappush(heap, (at + d.wait_us + (i * 7919) % (c.jitter_us + 1), i))
    return grants


clients_st = st.lists(st.tuples(st.integers(1, 30), st.floats(0, 0.5), st.integers(0, 3000)),
                      min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([100.0, 200.0, 1000.0]), clients_st)
def test_c_p3_alone_gets_at_least_90_percent(rate: float,
                                             raw: list[tuple[int, float, int]]) -> None:
    """Each client alone could spend 2 R (``token_us`` <= W / 2R); leases <= 10 % of S_3."""
    rule = ProviderRule("p", rate, DEFAULT_SHARES)
    lease_cap = max(1, int(rate * 0.3 * 0.1))
    clients = [Client(Tier.P3, min(n, lease_cap), i * 1000, int(speed * W / rate), jit)
               for i, (n, speed, jit) in enumerate(raw)]
    grants = simulate(rule, clients, 3 * W)
    assert sum(k for *_, k in grants) >= 0.9 * rate * 3
    assert max_window([(at, k) for at, _, k in grants], W) <= rate


@pytest.mark.parametrize(("rate", "p3_token_us"), [
    (200.0, 100), (1000.0, 100), (200.0, 13_500), (1000.0, 2700)])
def test_b_p0_takes_its_share_back_within_a_second(rate: float, p3_token_us: int) -> None:
    """P3 saturates (in bursts, or spread evenly over the window); from ``start`` two P0
    clients always want more. P0 holds ``⌊S_0⌋ - lease`` in every window from
    ``start + W + 0.1 s`` on, and the total stays under ``R``."""
    rule = ProviderRule("p", rate, DEFAULT_SHARES)
    s0 = rule.capacities[0]
    lease = max(1, int(0.1 * s0))
    start = 2 * W
    clients = [Client(Tier.P3, 30, i * 500, p3_token_us, 500) for i in range(3)]
    clients += [Client(Tier.P0, lease, start + i * 300, 50) for i in range(2)]
    grants = simulate(rule, clients, 5 * W)
    p0 = [(at, k) for at, tier, k in grants if tier is Tier.P0]
    p3 = [(at, k) for at, tier, k in grants if tier is Tier.P3]
    assert window_sum(p3, start) == rate
    settled = start + W + 100_000
    for end in range(settled, 5 * W, 10_000):
        assert window_sum(p0, end) >= math.floor(s0) - lease, end
        assert window_sum(p0, end) + window_sum(p3, end) <= rate
    reclaimed = min(at for at in range(start, 5 * W, 1000)
                    if window_sum(p0, at) >= math.floor(s0) - lease)
    assert reclaimed - start <= W + 100_000


# the worker-side limiter -------------------------------------------------------------------


class FlakyStore(ModelStore):
    def __init__(self, rules: CapacityRules, clock: ManualClock[float]) -> None:
        super().__init__(rules, lambda: round(clock.now * 1_000_000))
        self.down = False
        self.hang = asyncio.Event()
        """While clear after ``down``: requests wait, then time out (a black-holed Redis)."""
        self.hang.set()
        self.calls: list[Request] = []

    async def request(self, provider_id: str, request: Request,
                      now_us: int | None = None) -> Decision:
        await self.hang.wait()
        if self.down:
            raise RedisConnectionError("connection refused")
        self.calls.append(request)
        return await super().request(provider_id, request, now_us)


def limiter_for(rate: float = 1000.0, **kwargs: Any) -> tuple[CapacityLimiter, FlakyStore,
                                                                  ManualClock[float]]:
    clock = ManualClock(100.0)
    store = FlakyStore(CapacityRules.from_settings(Settings(provider_rates={"tw": rate})),
                       clock)
    return CapacityLimiter(store, clock=clock, **kwargs), store, clock  # type: ignore[arg-type]


async def test_leases_grow_while_used_and_shrink_when_they_expire() -> None:
    limiter, store, clock = limiter_for()
    for _ in range(1 + 2 + 4 + 8 + 16 + 20 + 20):
        assert await limiter.acquire("tw", Tier.P0) is None
    assert [r.n for r in store.calls] == [1, 2, 4, 8, 16, 20, 20]
    clock.now += 0.1
    assert await limiter.acquire("tw", Tier.P0) is None
    assert await limiter.acquire("tw", Tier.P0) is None
    clock.now += 0.3
    assert await limiter.acquire("tw", Tier.P0) is None
    assert store.calls[-1].n == 2
    assert limiter.stats.expired_unused == 20 - 2
    assert limiter.stats.round_trips == 9


async def test_refusal_returns_the_wait_without_asking_again() -> None:
    limiter, store, clock = limiter_for(rate=10.0)
    taken = 0
    while await limiter.acquire("tw", Tier.P0) is None:
        taken += 1
    assert taken == 2
    calls = len(store.calls)
    clock.now += 0.25
    wait = await limiter.acquire("tw", Tier.P0)
    assert wait is not None and wait == pytest.approx(0.75, abs=1e-3)
    assert len(store.calls) == calls


async def test_limiter_from_settings_opens_its_own_store() -> None:
    limiter = CapacityLimiter(Settings(topic_prefix="x."))
    assert isinstance(limiter.store, CapacityStore)
    assert limiter.store.ns == "x." and limiter.rules.provider("twilio").rate == 1000.0
    await limiter.aclose()


async def test_take_waits_on_the_event_loop() -> None:
    limiter, _store, _clock = limiter_for()
    await limiter.take("tw", Tier.P1, tenant_id="acme", tenant_rate=50.0)
    assert limiter.stats.leased == 1


async def test_redis_down_local_tier_uses_a_conservative_local_bucket(
        caplog: pytest.LogCaptureFixture) -> None:
    limiter, store, clock = limiter_for(expected_workers=2)
    assert await limiter.acquire("tw", Tier.P0) is None
    store.down = True
    with caplog.at_level(logging.WARNING, "notiflow.adapters.ratelimit"):
        granted = await granted_over(limiter, "tw", Tier.P0, clock, 2000)
    local_rate = 0.5 * 200.0 / 2
    burst = local_rate * 0.25
    assert local_rate * 2 <= granted <= local_rate * 2 + burst + 1
    assert not limiter.redis_ok
    assert sum("unreachable" in r.message for r in caplog.records) == 1


async def test_redis_down_pause_tier_waits_then_recovers() -> None:
    limiter, store, clock = limiter_for()
    store.down = True
    assert await limiter.acquire("tw", Tier.P3) == 0.5
    assert not limiter.redis_ok
    store.down = False
    assert await limiter.acquire("tw", Tier.P3) == 0.5
    clock.now += 0.5
    assert await limiter.acquire("tw", Tier.P3) == 0.5, "the probe runs in the background"
    await loop_turns()
    assert limiter.redis_ok
    assert await limiter.acquire("tw", Tier.P3) is None
    assert limiter.stats.paused == 3


async def test_no_caller_waits_on_a_black_holed_redis() -> None:
    """Once Redis failed, callers take the local bucket at once: the probe that asks again
    runs in the background, one at a time, however long it hangs."""
    limiter, store, clock = limiter_for()
    store.down = True
    assert await limiter.acquire("tw", Tier.P0) is None
    store.hang.clear()
    for _ in range(20):
        clock.now += 0.25
        assert await asyncio.wait_for(limiter.acquire("tw", Tier.P0), 0.05) is None
    assert len(limiter._probes) == 1 and not limiter.redis_ok
    store.down = False
    store.hang.set()
    await loop_turns(2)
    assert limiter.redis_ok and not limiter._probes
    await limiter.aclose()


async def test_tenant_limit_lease_is_small() -> None:
    limiter, store, _clock = limiter_for()
    for _ in range(8):
        assert await limiter.acquire("tw", Tier.P2, "acme", 30.0) is None
    assert max(r.n for r in store.calls) == 3
    assert all(r.tenant_id == "acme" for r in store.calls)
