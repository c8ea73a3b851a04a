"""One process's Redis clients share what they have seen (``adapters/redis_health.py``): a
timeout in one of them (the breakers here) sends the limiter and the dedup calls to their
fallbacks at once, without each waiting out a timeout of its own; an answer clears it, and
after ``hold_s`` the next call asks Redis again. Each client's :class:`RedisGuard` goes off
Redis only when Redis does not answer, and comes back by one probe at a time."""

from __future__ import annotations

import asyncio
import random

import pytest
from cryptography.fernet import Fernet
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.redis_health import RedisGuard, RedisHealth, RedisUnreachable
from notiflow.flows.send.stages.context import SendContext
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.fakes import ManualClock
from tests.helpers import partial_ports
from tests.unit.test_circuit_breakers import DEFAULT
from tests.unit.test_circuit_breakers import T0 as BREAKER_T0
from tests.unit.test_circuit_breakers import FlakyStore as FlakyBreakerStore
from tests.unit.test_ratelimit_model import limiter_for
from tests.unit.test_send_context_redis import START as WALL_START


def test_health_is_down_for_hold_after_a_failure_until_an_answer() -> None:
    clock = ManualClock(100.0)
    health = RedisHealth(hold_s=1.0, clock=clock)
    assert not health.down
    health.failed()
    clock.now += 0.5
    assert health.down
    clock.now += 0.5
    assert not health.down
    health.failed()
    health.answered()
    assert not health.down


async def test_a_breaker_timeout_spares_the_limiter_and_the_dedup_calls() -> None:
    health = RedisHealth(hold_s=1.0, clock=ManualClock(100.0))
    bclock = ManualClock(BREAKER_T0)
    bstore = FlakyBreakerStore(DEFAULT, bclock)
    cb = CircuitBreakers(bstore, clock_us=bclock, health=health)
    limiter, lstore, _ = limiter_for(health=health)
    settings = Settings()
    ctx = SendContext(settings, Tier.P0, settings.policy(Tier.P0),
                      DlqCipher(Fernet.generate_key()), ManualClock(WALL_START), random.Random(1),
                      "send.p0")
    ctx.attach(partial_ports(health=health))
    asked: list[str] = []

    async def lease() -> str:
        asked.append("lease")
        return "answer"

    bstore.down = True
    await cb.allow("tw")
    assert health.down and not cb.redis_ok
    lstore.hang.clear()
    assert await asyncio.wait_for(limiter.acquire("tw", Tier.P0), 0.05) is None
    assert lstore.calls == [] and limiter.stats.local_grants == 1
    assert await ctx.redis(lease, "fallback") == "fallback" and asked == []
    health.answered()
    assert await ctx.redis(lease, "fallback") == "answer" and asked == ["lease"]
    lstore.hang.set()
    assert await limiter.acquire("tw", Tier.P0) is None and len(lstore.calls) == 1
    await limiter.aclose()


async def test_a_down_health_keeps_a_healthy_breaker_off_redis() -> None:
    health = RedisHealth(hold_s=1.0, clock=ManualClock(100.0))
    bclock = ManualClock(BREAKER_T0)
    bstore = FlakyBreakerStore(DEFAULT, bclock)
    cb = CircuitBreakers(bstore, clock_us=bclock, health=health)
    health.failed()
    assert (await cb.allow("tw")).admitted
    assert bstore.calls == [] and cb.redis_ok


def test_a_guard_goes_off_redis_only_when_redis_does_not_answer() -> None:
    clock = ManualClock(100.0)
    health = RedisHealth(hold_s=1.0, clock=clock)
    guard = RedisGuard(health, probe_interval=0.5, clock=clock)
    assert guard.asks
    assert not guard.failed(ResponseError("ERR user_script:1: boom"))
    assert guard.asks and not health.down
    assert guard.failed(RedisTimeout("Timeout reading from socket"))
    assert not guard.failed(ConnectionRefusedError())
    assert not guard.asks and health.down and not guard.ok
    assert not guard.may_probe()
    clock.now += 0.5
    assert guard.may_probe() and not guard.may_probe()
    guard.probe_done()
    assert guard.answered() and guard.asks and not health.down
    assert not guard.answered()


def test_a_failed_probe_pushes_the_next_one_back_and_keeps_the_health_down() -> None:
    clock = ManualClock(100.0)
    health = RedisHealth(hold_s=1.0, clock=clock)
    guard = RedisGuard(health, probe_interval=0.5, clock=clock)
    guard.failed(RedisTimeout())
    clock.now += 1.0
    assert not health.down and guard.may_probe()
    guard.failed(RedisTimeout())
    guard.probe_done()
    assert health.down and not guard.may_probe()
    clock.now += 0.5
    assert guard.may_probe()


def test_a_guard_stays_off_redis_while_another_client_finds_it_down() -> None:
    clock = ManualClock(100.0)
    health = RedisHealth(hold_s=1.0, clock=clock)
    guard = RedisGuard(health, clock=clock)
    health.failed()
    assert guard.ok and not guard.asks and not guard.may_probe()


async def test_ask_does_not_mark_redis_down_on_an_error_answer() -> None:
    health = RedisHealth(hold_s=1.0, clock=ManualClock(100.0))

    async def script_error() -> None:
        raise ResponseError("ERR user_script:1: boom")

    async def no_answer() -> None:
        raise RedisTimeout("Timeout reading from socket")

    with pytest.raises(RedisUnreachable) as answered:
        await health.ask(script_error, 0.1)
    assert not answered.value.fresh and not health.down
    with pytest.raises(RedisUnreachable) as silent:
        await health.ask(no_answer, 0.1)
    assert silent.value.fresh and health.down
