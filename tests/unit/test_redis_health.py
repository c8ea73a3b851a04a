"""One process's Redis clients share what they have seen (``adapters/redis_health.py``): a
timeout in one of them (the breakers here) sends the limiter and the dedup calls to their
fallbacks at once, without each waiting out a timeout of its own; an answer clears it, and
after ``hold_s`` the next call asks Redis again."""

from __future__ import annotations

import asyncio
import random

from cryptography.fernet import Fernet

from notiflow.adapters.breaker import CircuitBreakers
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.redis_health import RedisHealth
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
