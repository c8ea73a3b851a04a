"""The API's two Redis users (admission control and idempotency fences) against a Redis that
stops answering: the first timeout tells the other, which falls back at once instead of
waiting out its own; and P0's first timeouts along its whole path stay a small share of its
SLA."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Iterator
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from notiflow.adapters.admission import AdmissionStore, AdmissionUnavailable, Bucket
from notiflow.adapters.idempotency_fence import Fence, FenceUnavailable, Holder
from notiflow.schemas.enums import Tier
from notiflow.settings import ApiRedisTimeout, Settings

TIMEOUT_S = 0.2


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A port that accepts connections and never answers (a partition, not a refusal)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1]
    server.close()
    for c in held:
        c.close()


async def _timed(call: Awaitable[object]) -> tuple[type[BaseException] | None, float]:
    started = time.monotonic()
    try:
        await call
    except (AdmissionUnavailable, FenceUnavailable) as exc:
        return type(exc), time.monotonic() - started
    return None, time.monotonic() - started


async def test_the_first_timeout_sends_the_other_client_to_its_fallback(black_hole: int) -> None:
    client = aioredis.Redis(host="127.0.0.1", port=black_hole, socket_timeout=5,
                            socket_connect_timeout=5)
    store = AdmissionStore(client, "t:", timeout_s=TIMEOUT_S, down_backoff_s=1.0)
    fence = Fence(client, "t:", timedelta(minutes=1), timeout_s=TIMEOUT_S,
                  down_backoff_s=1.0, health=store.health)
    kind, waited = await _timed(store.take([Bucket("t:admission:x", 10, 10)]))
    assert kind is AdmissionUnavailable and waited >= TIMEOUT_S * 0.9
    kind, waited = await _timed(fence.claim("acme", "k1", Holder("h", "m")))
    assert kind is FenceUnavailable and waited < 0.05, waited
    alone = Fence(client, "t:", timedelta(minutes=1), timeout_s=TIMEOUT_S, down_backoff_s=1.0)
    kind, waited = await _timed(alone.claim("acme", "k2", Holder("h", "m")))
    assert kind is FenceUnavailable and waited >= TIMEOUT_S * 0.9
    await client.aclose(close_connection_pool=True)


async def test_an_answer_clears_what_a_timeout_marked(black_hole: int) -> None:
    dead = aioredis.Redis(host="127.0.0.1", port=black_hole, socket_timeout=5)
    store = AdmissionStore(dead, "t:", timeout_s=TIMEOUT_S, down_backoff_s=60.0)
    await _timed(store.take([Bucket("t:admission:x", 10, 10)]))
    assert store.health.down
    store.health.answered()
    assert not store.health.down
    await dead.aclose(close_connection_pool=True)


def test_p0s_first_redis_timeouts_are_a_small_share_of_its_sla() -> None:
    """Along P0's path one timeout in the API (admission and fences share it) and one in
    the send flow (its clients share theirs) may be paid before everything falls back."""
    settings = Settings()
    p0 = settings.policy(Tier.P0)
    paid = settings.api_redis_timeout.of("priority") + p0.redis_timeout
    assert paid <= p0.sla * 0.4, paid
    assert ApiRedisTimeout().of("all") == ApiRedisTimeout().of("bulk") > \
        ApiRedisTimeout().of("priority")
