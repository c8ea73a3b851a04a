"""Circuit breakers against real Redis: the Lua script steps exactly like the reference model
(driven time), two :class:`CircuitBreakers` ("processes") agree on one state and emit each
transition once, concurrent outcomes open a breaker exactly once, and a Redis outage falls
back to local breakers and converges back.

Uses the shared local Redis when it answers (``NOTIFLOW_REDIS_URL`` or the default), else a
private ``redis-server``; every test has its own key namespace, so runs never collide.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from notiflow.adapters.breaker import (
    AdmissionKind,
    BreakerParams,
    ModelState,
    Op,
    State,
    StateChange,
    Verdict,
    run_model,
)
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.breaker.store import BreakerStore
from notiflow.adapters.providers.base import Outcome
from notiflow.devenv import free_port
from notiflow.settings import BreakerRule, Settings
from tests.fakes import ManualClock
from tests.helpers import first_changes, loop_turns, wait_until
from tests.integration.conftest import RedisServer

pytestmark = pytest.mark.integration

S = 1_000_000
T0 = 1_700_000_000_000_000
KEY_TTL_MS = 600_000
DEFAULT = BreakerParams.from_rule(BreakerRule())
SMALL = BreakerParams.from_rule(BreakerRule(
    window=timedelta(seconds=10), buckets=5, failure_threshold=2, min_calls=4,
    min_latency_calls=5, open_for=timedelta(seconds=20), min_probes=3, close_ratio=0.75,
    max_probes=8, throttle_gap=timedelta(seconds=2), weight_recovery=timedelta(seconds=10)))


def namespace() -> str:
    return f"cb{uuid.uuid4().hex[:10]}."


def store_for(url: str, ns: str, params: BreakerParams = DEFAULT) -> BreakerStore:
    return BreakerStore(aioredis.Redis.from_url(url, decode_responses=True), params, ns,
                        KEY_TTL_MS)


# Lua == model, with driven time -----------------------------------------------------------

OPS = [Op("k"), Op("n"), Op("g"),
       *(Op("r", v, slow, probe, ep, reason)
         for v, reason in ((Verdict.SUCCESS, ""), (Verdict.FAILURE, "server_error"),
                           (Verdict.FAILURE, ""), (Verdict.THROTTLED, "rate_limited"))
         for slow in (False, True) for probe in (False, True) for ep in (-1, 0, 1, 2))]
weighted_ops = st.sampled_from(OPS + [Op("r", Verdict.SUCCESS)] * 12
                               + [Op("r", Verdict.SUCCESS, False, True, -1)] * 12)
steps = st.lists(st.tuples(st.one_of(st.integers(-S, 2 * S), st.integers(0, 40 * S)),
                           st.lists(weighted_ops, min_size=1, max_size=6)),
                 min_size=1, max_size=80)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.sampled_from([DEFAULT, SMALL]), trace=steps)
async def test_lua_steps_exactly_like_the_model(
        client: aioredis.Redis, params: BreakerParams,
        trace: list[tuple[int, list[Op]]]) -> None:
    store = BreakerStore(client, params, namespace(), KEY_TTL_MS)
    model = ModelState()
    t = T0
    for dt, ops in trace:
        t += dt
        got = await store.run("p", ops, t)
        assert got == run_model(model, params, ops, t)
    await client.delete(store.key("p"))


async def test_redis_time_is_the_clock(client: aioredis.Redis) -> None:
    store = BreakerStore(client, DEFAULT, namespace(), KEY_TTL_MS)
    before = time.time_ns() // 1000
    result = await store.run("p", [Op("r", Verdict.FAILURE)])
    assert abs(result.snapshot.now_us - before) < 5 * S
    assert await client.pttl(store.key("p")) > KEY_TTL_MS - 10_000
    later = await store.run("p", [Op("k")], result.snapshot.now_us - 10 * S)
    assert later.snapshot.now_us == result.snapshot.now_us


async def test_new_bucket_layout_starts_an_empty_window(client: aioredis.Redis) -> None:
    ns = namespace()
    small, default = (BreakerStore(client, p, ns, KEY_TTL_MS) for p in (SMALL, DEFAULT))
    await small.run("p", [Op("r", Verdict.SUCCESS)] * 3, T0)
    result = await default.run("p", [Op("r", Verdict.SUCCESS)], T0 + 1)
    assert result.snapshot.calls == 1
    fields = await client.hkeys(small.key("p"))
    assert [f for f in fields if f[0] == "b" and f[1:].isdigit()] == [f"b{T0 // S % 30}"]
    await client.delete(small.key("p"))


# two processes -------------------------------------------------------------------------------


async def test_two_processes_agree_and_emit_each_transition_once(redis_url: str) -> None:
    ns, clock = namespace(), ManualClock(T0)
    a = CircuitBreakers(store_for(redis_url, ns), clock_us=clock, cache_ttl=0.2)
    b = CircuitBreakers(store_for(redis_url, ns), clock_us=clock, cache_ttl=0.2)
    events: list[tuple[str, StateChange]] = []
    a.on_change(lambda c: events.append(("a", c)))
    b.on_change(lambda c: events.append(("b", c)))

    assert (await b.allow("tw")).kind is AdmissionKind.NORMAL
    for i in range(5):
        state = await a.record("tw", Outcome.TRANSIENT, "server_error", 0.1)
        assert state is (State.OPEN if i == 4 else State.CLOSED)
    assert (await b.allow("tw")).kind is AdmissionKind.NORMAL
    clock.now += 200_000
    refused = await b.allow("tw")
    assert refused.kind is AdmissionKind.REFUSED
    assert refused.retry_in == pytest.approx(59.8)
    assert a.state("tw") is b.state("tw") is State.OPEN

    clock.now = T0 + 60 * S
    assert a.state("tw") is b.state("tw") is State.HALF_OPEN
    probe = await b.allow("tw")
    assert probe.kind is AdmissionKind.PROBE and probe.episode == 1
    assert (await a.allow("tw")).kind is AdmissionKind.REFUSED
    for i in range(20):
        which = a if i % 2 else b
        await which.record("tw", Outcome.ACCEPTED, None, 0.05, True, episode=probe.episode)
        clock.now += 1000
    assert a.state("tw") is State.CLOSED
    assert b.state("tw") is State.HALF_OPEN
    clock.now += 200_000
    assert (await b.allow("tw")).kind is AdmissionKind.NORMAL
    assert a.state("tw") is b.state("tw") is State.CLOSED

    assert [(who, c.old, c.new, c.why) for who, c in events] == [
        ("a", State.CLOSED, State.OPEN, "failures:5"),
        ("b", State.OPEN, State.HALF_OPEN, "open_elapsed"),
        ("a", State.HALF_OPEN, State.CLOSED, "probes_ok:20/20")]
    assert events[1][1].at_us == T0 + 60 * S and all(c.shared for _, c in events)
    await a.aclose()
    await b.aclose()


async def test_concurrent_failures_open_exactly_once(redis_url: str) -> None:
    ns = namespace()
    procs = [CircuitBreakers(store_for(redis_url, ns)) for _ in range(2)]
    events: list[StateChange] = []
    for p in procs:
        p.on_change(events.append)
    await asyncio.gather(*(p.record("vn", Outcome.AMBIGUOUS, "timeout", 2.0)
                           for p in procs for _ in range(50)))
    assert [(c.old, c.new) for c in events] == [(State.CLOSED, State.OPEN)]
    assert {p.state("vn") for p in procs} == {State.OPEN}
    snapshots = [p.snapshot("vn") for p in procs]
    assert {s.episode for s in snapshots if s is not None} == {1}
    assert sum(p.stats.round_trips for p in procs) < 100
    for p in procs:
        await p.aclose()


async def test_state_changes_as_an_async_iterator(redis_url: str) -> None:
    ns, clock = namespace(), ManualClock(T0)
    cb = CircuitBreakers(store_for(redis_url, ns), clock_us=clock)
    task = first_changes(cb, 2)
    await loop_turns()
    for _ in range(5):
        await cb.record("fcm", Outcome.TRANSIENT, "server_error", 0.1)
    clock.now += 60 * S
    assert (await cb.allow("fcm")).kind is AdmissionKind.PROBE
    received = await asyncio.wait_for(task, 2)
    assert [(c.provider_id, c.new, c.why) for c in received] == [
        ("fcm", State.OPEN, "failures:5"), ("fcm", State.HALF_OPEN, "open_elapsed")]
    await cb.aclose()


# Redis down --------------------------------------------------------------------------------


async def test_redis_down_local_breaker_then_converges(
        caplog: pytest.LogCaptureFixture, private_redis: RedisServer) -> None:
    clock = ManualClock(T0)
    s = Settings(redis_url=private_redis.url, topic_prefix=namespace())
    cb = CircuitBreakers(s, clock_us=clock, retry_interval=0.5)
    events: list[StateChange] = []
    cb.on_change(events.append)
    assert (await cb.allow("tw")).kind is AdmissionKind.NORMAL
    assert await cb.record("tw", Outcome.ACCEPTED, None, 0.1) is State.CLOSED
    private_redis.stop()
    with caplog.at_level(logging.WARNING, "notiflow.adapters.breaker"):
        for _ in range(5):
            await cb.record("tw", Outcome.TRANSIENT, "server_error", 0.1)
            clock.now += 1000
        assert not cb.redis_ok and cb.state("tw") is State.OPEN
        for _ in range(10):
            assert (await cb.allow("tw")).kind is AdmissionKind.REFUSED
            clock.now += 300_000
    assert sum("unreachable" in r.message for r in caplog.records) == 1
    assert [(c.new, c.why, c.shared) for c in events] == [
        (State.OPEN, "failures:5", False)]
    assert cb.stats.local_ops >= 5

    private_redis.start()
    clock.now += 500_000
    assert (await cb.allow("tw")).kind is AdmissionKind.REFUSED
    await wait_until(lambda: cb.redis_ok, timeout=5, interval=0.01, what="the probe")
    assert cb.redis_ok and cb.state("tw") is State.CLOSED
    assert (await cb.allow("tw")).kind is AdmissionKind.NORMAL
    assert [(c.old, c.new, c.why) for c in events[1:]] == [
        (State.OPEN, State.CLOSED, "converged")]
    for _ in range(5):
        await cb.record("tw", Outcome.TRANSIENT, "server_error", 0.1)
    assert events[-1].shared and events[-1].why == "failures:5"
    await cb.aclose()


async def test_unreachable_from_the_start_decides_locally() -> None:
    s = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", topic_prefix=namespace())
    cb = CircuitBreakers(s)
    started = time.monotonic()
    assert (await cb.allow("tw")).kind is AdmissionKind.NORMAL
    for _ in range(5):
        await cb.record("tw", Outcome.AMBIGUOUS, "timeout", 2.0)
    assert cb.state("tw") is State.OPEN and not cb.redis_ok
    assert (await cb.allow("tw")).kind is AdmissionKind.REFUSED
    assert time.monotonic() - started < 2.0
    await cb.aclose()


# cost -------------------------------------------------------------------------------------


async def test_cost_per_call(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Cached ``allow`` and deferred successes stay off Redis; a prompt ``record`` costs at
    most one script call and concurrent ones share it. Prints the figures (``-s``)."""
    ns = namespace()
    cb = CircuitBreakers(store_for(redis_url, ns))
    await cb.allow("sg")

    async def timed(calls: int, fn: Callable[[], Awaitable[object]]) -> tuple[float, int]:
        trips = cb.stats.round_trips
        started = time.perf_counter()
        for _ in range(calls):
            await fn()
        return (time.perf_counter() - started) / calls * 1e6, cb.stats.round_trips - trips

    allow = await timed(20_000, lambda: cb.allow("sg"))

    async def successes() -> None:
        for _ in range(100):
            await cb.record("sg", Outcome.ACCEPTED, None, 0.05)
        await loop_turns()

    per_batch, success_trips = await timed(200, successes)
    success = (per_batch / 100, success_trips)
    await cb.flush()
    prompt = await timed(500, lambda: cb.record("sg", Outcome.TRANSIENT, "rate_limited", 0.05))
    concurrent = await timed(10, lambda: asyncio.gather(
        *(cb.record("sg", Outcome.TRANSIENT, "rate_limited", 0.05) for _ in range(200))))
    snap = cb.snapshot("sg")
    assert snap is not None and snap.calls == 20_000
    with capsys.disabled():
        print(f"\nbreaker cost per call: allow (cached) {allow[0]:.2f} µs ({allow[1]} script "
              f"calls / 20000); record success (deferred) {success[0]:.2f} µs ({success[1]} "
              f"script calls / 20000); record prompt, sequential {prompt[0]:.0f} µs "
              f"({prompt[1]} / 500); prompt, 200 concurrent {concurrent[0] / 200:.1f} µs "
              f"({concurrent[1]} script calls / 2000)")
    assert allow[1] <= 1 and success[1] <= 60 and prompt[1] == 500 and concurrent[1] <= 40
    assert allow[0] < 100 and success[0] < 200
    await cb.aclose()
