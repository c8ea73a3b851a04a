"""The send step's dedup calls when Redis stops answering: a tier on ``local`` falls back,
and for ``REDIS_RECHECK`` after a failure takes the fallback without asking (a black-holed
Redis costs one timeout a second, not one per call); the first answer after it clears the
state."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.fernet import Fernet
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeout

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.flows.send.stages.context import REDIS_RECHECK, SendContext
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.fakes import ManualClock
from tests.helpers import loop_turns

START = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_local_tier_stops_asking_a_failed_redis_for_a_while() -> None:
    settings = Settings()
    clock = ManualClock(START)
    ctx = SendContext(settings, Tier.P0, settings.policy(Tier.P0),
                      DlqCipher(Fernet.generate_key()), clock, random.Random(1), "send.p0")
    calls: list[str] = []
    down = True

    async def call() -> str:
        calls.append("asked")
        if down:
            raise RedisTimeout("Timeout reading from socket")
        return "answer"

    async def scenario() -> list[str]:
        nonlocal down
        out = [await ctx.redis(call, "fallback")]
        clock.now += REDIS_RECHECK / 2
        out.append(await ctx.redis(call, "fallback"))
        clock.now += REDIS_RECHECK
        out.append(await ctx.redis(call, "fallback"))
        down = False
        out.append(await ctx.redis(call, "fallback"))
        clock.now += REDIS_RECHECK + timedelta(milliseconds=1)
        out.append(await ctx.redis(call, "fallback"))
        out.append(await ctx.redis(call, "fallback"))
        return out

    assert asyncio.run(scenario()) == ["fallback", "fallback", "fallback", "fallback",
                                       "answer", "answer"]
    assert len(calls) == 4 and ctx.redis_ok and not ctx.redis_health.down


def test_one_call_at_a_time_asks_a_failed_redis_again() -> None:
    settings = Settings()
    clock = ManualClock(START)
    ctx = SendContext(settings, Tier.P0, settings.policy(Tier.P0),
                      DlqCipher(Fernet.generate_key()), clock, random.Random(1), "send.p0")

    async def scenario() -> tuple[str, str, str]:
        release = asyncio.Event()

        async def fails() -> str:
            raise RedisTimeout("Timeout reading from socket")

        async def hangs() -> str:
            await release.wait()
            return "answer"

        await ctx.redis(fails, "fallback")
        clock.now += REDIS_RECHECK
        probing = asyncio.create_task(ctx.redis(hangs, "fallback"))
        await loop_turns()
        other = await asyncio.wait_for(ctx.redis(hangs, "fallback"), 0.05)
        release.set()
        return await probing, other, await ctx.redis(hangs, "fallback")

    assert asyncio.run(scenario()) == ("answer", "fallback", "answer")


def test_a_probe_that_raises_something_else_does_not_stop_later_probes() -> None:
    settings = Settings()
    clock = ManualClock(START)
    ctx = SendContext(settings, Tier.P0, settings.policy(Tier.P0),
                      DlqCipher(Fernet.generate_key()), clock, random.Random(1), "send.p0")

    async def fails() -> str:
        raise RedisTimeout("Timeout reading from socket")

    async def bug() -> str:
        raise KeyError("a bug in the call")

    async def answers() -> str:
        return "answer"

    async def scenario() -> str:
        await ctx.redis(fails, "fallback")
        clock.now += REDIS_RECHECK
        with pytest.raises(KeyError):
            await ctx.redis(bug, "fallback")
        return await ctx.redis(answers, "fallback")

    assert asyncio.run(scenario()) == "answer"


def test_an_error_answer_takes_the_fallback_without_putting_the_tier_off_redis() -> None:
    settings = Settings()
    clock = ManualClock(START)
    ctx = SendContext(settings, Tier.P0, settings.policy(Tier.P0),
                      DlqCipher(Fernet.generate_key()), clock, random.Random(1), "send.p0")
    answers = iter([ResponseError("ERR user_script:1: boom"), "answer"])

    async def call() -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def scenario() -> list[str]:
        return [await ctx.redis(call, "fallback"), await ctx.redis(call, "fallback")]

    assert asyncio.run(scenario()) == ["fallback", "answer"]
    assert ctx.redis_ok and not ctx.redis_health.down
