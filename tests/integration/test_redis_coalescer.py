"""The Redis coalescer on a real server: commands of one event-loop turn share one round trip,
each caller gets its own reply or error, and a lost connection fails every waiting caller
(which the send flow's Redis-down policy then handles)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from notiflow.adapters.ports import Confirm
from notiflow.adapters.redis_dedup import DedupStore
from notiflow.adapters.redis_pool import Coalescer, redis_client
from notiflow.correlation import CorrelationKeys
from notiflow.settings import Settings
from tests.integration.conftest import RedisServer

KEYS = CorrelationKeys((b"g" * 32,))


class CountingCoalescer(Coalescer):
    def __init__(self, client: aioredis.Redis) -> None:
        super().__init__(client)
        self.round_trips: list[int] = []

    async def _flush(self) -> None:
        self.round_trips.append(len(self._queued))
        await super()._flush()


async def test_one_round_trip_per_loop_turn_and_replies_in_order(redis_url: str) -> None:
    client = redis_client(Settings(redis_url=redis_url), timeout=5)
    batch = CountingCoalescer(client)
    ns = uuid.uuid4().hex
    try:
        sets = [batch.call(lambda p, i=i: p.set(f"{ns}:{i}", str(i))) for i in range(50)]
        assert await asyncio.gather(*sets) == [True] * 50
        gets = [batch.call(lambda p, i=i: p.get(f"{ns}:{i}")) for i in range(50)]
        assert await asyncio.gather(*gets) == [str(i) for i in range(50)]
        assert batch.round_trips == [50, 50]
    finally:
        await client.delete(*(f"{ns}:{i}" for i in range(50)))
        await client.aclose()


async def test_a_command_error_fails_only_its_caller(redis_url: str) -> None:
    client = redis_client(Settings(redis_url=redis_url), timeout=5)
    batch = Coalescer(client)
    key = f"{uuid.uuid4().hex}:list"
    try:
        await client.rpush(key, "x")
        ok = batch.call(lambda p: p.llen(key))
        wrong = batch.call(lambda p: p.incr(key))
        also_ok = batch.call(lambda p: p.lrange(key, 0, -1))
        results = await asyncio.gather(ok, wrong, also_ok, return_exceptions=True)
        assert results[0] == 1 and results[2] == ["x"]
        assert isinstance(results[1], ResponseError)
    finally:
        await client.delete(key)
        await client.aclose()


async def test_lost_connection_fails_every_waiting_caller() -> None:
    server = RedisServer()
    server.start()
    client = redis_client(Settings(redis_url=server.url), timeout=1, connect_timeout=0.5)
    batch = Coalescer(client)
    try:
        assert await batch.call(lambda p: p.ping()) is True
        server.stop()
        results = await asyncio.gather(*(batch.call(lambda p: p.ping()) for _ in range(5)),
                                       return_exceptions=True)
        assert all(isinstance(r, RedisConnectionError | OSError) for r in results), results
    finally:
        await client.aclose()
        server.stop()


async def test_dedup_confirm_and_finish_share_round_trips(redis_url: str) -> None:
    """Concurrent sends confirm and finish their leases through the coalescer; the lease
    semantics are unchanged (confirm LOST once another owner holds the lease), and the
    cancel gates of attempts that end RETRY_PENDING are cleared in the same round trip."""
    client = redis_client(Settings(redis_url=redis_url), timeout=5)
    ns = f"{uuid.uuid4().hex}:"
    ours = DedupStore(client, "us", ns, keys=KEYS)
    theirs = DedupStore(client, "them", ns, keys=KEYS)
    counting = ours.batch = CountingCoalescer(client)
    ttl = timedelta(minutes=1)
    keys = [ours.lease_key(f"m{i}", 1) for i in range(20)]
    gates = [ours.gate_key(f"m{i}") for i in range(20)]
    try:
        assert all(s.acquired for s in await ours.acquire(keys[:19], ttl))
        assert all(s.acquired for s in await theirs.acquire(keys[19:], ttl))
        confirmed = await asyncio.gather(*(ours.confirm(k, g, ttl)
                                           for k, g in zip(keys, gates, strict=True)))
        assert confirmed == [Confirm.OURS] * 19 + [Confirm.LOST]
        assert await client.mget(gates) == ["sending"] * 19 + [None]
        await asyncio.gather(*(ours.finish([(k, {"status": "PROVIDER_ACCEPTED"})], ttl,
                                           [g] if i % 2 else [])
                               for i, (k, g) in enumerate(zip(keys[:19], gates[:19], strict=True))))
        states = await ours.acquire(keys[:19], ttl)
        assert [s.done for s in states] == [{"status": "PROVIDER_ACCEPTED"}] * 19
        assert await client.mget(gates[:4]) == ["sending", None, "sending", None]
        assert counting.round_trips == [20, 19 + 9]
    finally:
        await client.delete(*keys, *gates)
        await client.aclose()



async def test_waiting_for_a_free_connection_is_not_an_error(redis_url: str) -> None:
    """Five commands queue for the one connection of a pool, each holding it 0.4 s: the last
    waits ~1.6 s, longer than the 1 s socket timeout, and still succeeds (a busy pool is not a
    Redis outage). The API's admission pool waits no longer than its timeout."""
    client = redis_client(Settings(redis_url=redis_url), timeout=1.0, max_connections=1)
    key = f"{uuid.uuid4().hex}:empty"
    try:
        results = await asyncio.gather(*(client.blpop([key], timeout=0.4) for _ in range(5)))
        assert results == [None] * 5
    finally:
        await client.aclose()
    strict = redis_client(Settings(redis_url=redis_url), timeout=0.5, max_connections=1,
                          pool_wait=0.5)
    try:
        results = await asyncio.gather(*(strict.blpop([key], timeout=0.4) for _ in range(5)),
                                       return_exceptions=True)
        assert any(isinstance(r, RedisConnectionError) for r in results), results
    finally:
        await strict.aclose()
