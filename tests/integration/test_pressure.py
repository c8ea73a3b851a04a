"""P0's latency signal in real Redis (``adapters/pressure.py``) and the two ends of it in the
dispatcher: the P0 dispatcher reports its worst latency, a bulk dispatcher narrows its
in-flight window and its intake while that is above ``bulk_yield.high`` and widens them again
once P0 is calm (``flows/common/yielding.py``)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import pytest
import redis.asyncio as aioredis
from cryptography.fernet import Fernet

from notiflow.adapters import pressure
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.redis_dedup import DedupStore
from notiflow.adapters.send_ports import RedisBoards
from notiflow.correlation import CorrelationKeys
from notiflow.flows.common.yielding import Slots
from notiflow.flows.send.dispatch import ChannelPressure, Dispatcher
from notiflow.flows.send.flow import send_stages
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings
from tests.helpers import no_ports, partial_ports, wait_until

KEYS = CorrelationKeys((b"g" * 32,))

pytestmark = pytest.mark.integration


async def test_the_worst_fresh_report_wins_and_stale_ones_go(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    prefix = f"pr{uuid.uuid4().hex[:8]}."
    now = time.time()
    try:
        assert await pressure.worst(client, prefix) is None
        await pressure.report(client, prefix, "a", 0.12, now=now)
        await pressure.report(client, prefix, "b", 0.48, now=now - 1)
        await pressure.report(client, prefix, "c", 9.0, now=now - pressure.STALE_AFTER_S - 1)
        await pressure.report(client, prefix, "d", 9.0,
                              now=now - pressure.FORGET_AFTER_S - 1)
        assert await pressure.worst(client, prefix, now=now) == 0.48
        assert set(await client.hkeys(pressure.pressure_key(prefix))) == {"a", "b", "c"}
    finally:
        await client.delete(pressure.pressure_key(prefix))
        await client.aclose()


def dispatcher(redis_url: str, tier: Tier, prefix: str,
               monkeypatch: pytest.MonkeyPatch) -> tuple[Dispatcher, aioredis.Redis]:
    monkeypatch.setenv("NOTIFLOW_TENANTS", '[{"id": "acme", "token": "%s"}]' % ("t" * 32))
    s = Settings(redis_url=redis_url, topic_prefix=prefix,
                 dlq_key=Fernet.generate_key().decode())
    policy = s.policy(tier)
    d = Dispatcher(s, tier, policy, DlqCipher.from_settings(s),
                   ChannelPressure(policy.max_queued + policy.max_in_flight),
                   lambda: datetime.now(UTC), no_ports, f"test:{tier.value}", send_stages())
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    d.ctx.attach(partial_ports(leases=DedupStore(client, d.owner, prefix, keys=KEYS),
                               boards=RedisBoards(client, prefix, d.owner)))
    d._sems = {c: Slots(policy.max_in_flight) for c in Channel}
    return d, client


async def test_p0_reports_and_bulk_yields_then_recovers(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = f"pr{uuid.uuid4().hex[:8]}."
    p0, c0 = dispatcher(redis_url, Tier.P0, prefix, monkeypatch)
    p3, c3 = dispatcher(redis_url, Tier.P3, prefix, monkeypatch)
    ceiling = p3.window.ceiling
    p0._oldest["msg_slow:1"] = (Tier.P0, time.time() - 0.8, Channel.SMS)
    tasks = [asyncio.create_task(p0._report_pressure()),
             asyncio.create_task(p3._follow_pressure())]
    try:
        async def narrowed() -> bool:
            return ((await pressure.worst(c0, prefix) or 0) >= 0.8
                    and p0.reported is not None and p0.reported >= 0.8
                    and p3.window.limit < ceiling / 4)

        await wait_until(narrowed, timeout=10, interval=0.1, what="P3 narrowed by P0 pressure")
        assert (await pressure.worst(c0, prefix) or 0) >= 0.8
        assert p0.reported is not None and p0.reported >= 0.8
        assert p3.window.limit < ceiling / 4
        assert p3._sems[Channel.EMAIL].limit == p3.window.limit
        assert p3.pressure.share == p3.window.limit / ceiling
        narrowest = p3.window.limit

        del p0._oldest["msg_slow:1"]
        p0.ctx.p0_latencies.add(0.05)
        await wait_until(lambda: p3.window.limit > narrowest, timeout=10, interval=0.1,
                         what="P3 widened after the pressure eased")
        assert p3.window.limit > narrowest
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await c0.delete(pressure.pressure_key(prefix))
        await c0.aclose()
        await c3.aclose()
