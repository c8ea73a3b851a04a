"""The API's Redis clients after a Redis restart: every pooled connection is closed on the
server's side, and the next calls must reconnect rather than read as "Redis down" (which
made the API refuse P2/P3 with 503 for a while after each restart)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from notiflow.adapters.admission import AdmissionStore, one_second_bucket
from notiflow.adapters.idempotency_fence import Fence, Holder
from notiflow.settings import Settings
from tests.integration.conftest import RedisServer

pytestmark = pytest.mark.integration

CALLS = 24


async def _round(store: AdmissionStore, fence: Fence, ns: str) -> None:
    """``CALLS`` concurrent token takes and fence claims (enough to open several pooled
    connections); raises if any of them found Redis unavailable."""
    buckets = [one_second_bucket(f"{ns}:bucket", 1_000_000)]
    takes = [store.take(buckets) for _ in range(CALLS)]
    claims = [fence.claim("t", uuid.uuid4().hex, Holder("h", uuid.uuid4().hex))
              for _ in range(CALLS)]
    verdicts = await asyncio.gather(*takes)
    held = await asyncio.gather(*claims)
    assert all(v.admitted for v in verdicts)
    assert held == [None] * CALLS


async def test_admission_and_fences_reconnect_after_a_redis_restart(
        private_redis: RedisServer) -> None:
    store = AdmissionStore.open(Settings(redis_url=private_redis.url))
    fence = Fence(store.r, "restart-", timedelta(seconds=30), timeout_s=1.0,
                  down_backoff_s=1.0)
    ns = uuid.uuid4().hex
    try:
        await _round(store, fence, ns)
        opened = len(store.r.connection_pool._in_use_connections
                     | set(store.r.connection_pool._available_connections))
        assert opened > 1
        private_redis.stop(kill=True)
        private_redis.start()
        await _round(store, fence, ns)
    finally:
        await store.aclose()


async def test_a_claim_resent_by_its_holder_is_its_own(private_redis: RedisServer) -> None:
    store = AdmissionStore.open(Settings(redis_url=private_redis.url))
    fence = Fence(store.r, "resend-", timedelta(seconds=30), timeout_s=1.0,
                  down_backoff_s=1.0)
    mine, other = Holder("h1", "m1"), Holder("h2", "m2")
    try:
        assert await fence.claim("t", "k", mine) is None
        assert await fence.claim("t", "k", mine) is None
        assert await fence.claim("t", "k", other) == mine
    finally:
        await store.aclose()
