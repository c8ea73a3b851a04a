"""Idempotency fences on real Redis and reservations on real Cassandra: the release script
against its Python model, one owner among concurrent requests with one key, and the
transaction that replaces the fence without Redis seeing what fences wrote (and back)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis
from cassandra.cluster import Session
from hypothesis import given, settings
from hypothesis import strategies as st

from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.idempotency_fence import RELEASE, Fence, Holder, release_model
from notiflow.adapters.redis_pool import redis_client
from notiflow.devenv import free_port
from notiflow.gateway.errors import ApiError
from notiflow.gateway.reservation import Claim, Reserved, Taken, reserve
from notiflow.settings import Settings

pytestmark = pytest.mark.integration

TTL = timedelta(seconds=60)
Op = tuple[str, int, str]
OPS = st.lists(st.tuples(st.sampled_from(["claim", "release"]), st.integers(0, 2),
                         st.sampled_from(["a:1", "a:2", "b:1"])), max_size=30)


@pytest.fixture(scope="module")
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_claim_and_release_match_the_python_model(sync_redis: redis.Redis,
                                                  ops: list[Op]) -> None:
    ns = uuid.uuid4().hex
    script = sync_redis.register_script(RELEASE)
    model: dict[str, str] = {}
    try:
        for op, k, value in ops:
            key = f"{ns}:fence:{{t}}:{k}"
            if op == "claim":
                previous = sync_redis.set(key, value, nx=True, px=60_000, get=True)
                assert previous == model.get(key)
                model.setdefault(key, value)
            else:
                assert script(keys=[key], args=[value]) == release_model(model, key, value)
        for k in range(3):
            assert sync_redis.get(f"{ns}:fence:{{t}}:{k}") == model.get(f"{ns}:fence:{{t}}:{k}")
    finally:
        for k in range(3):
            sync_redis.delete(f"{ns}:fence:{{t}}:{k}")


@pytest.fixture
async def fence(redis_url: str) -> AsyncIterator[Fence]:
    client = redis_client(Settings(redis_url=redis_url), timeout=0.25, pool_wait=0.25)
    yield Fence(client, f"{uuid.uuid4().hex}:", TTL, timeout_s=0.25, down_backoff_s=1.0)
    await client.aclose()


async def test_a_fence_expires_and_keeps_its_tenant_in_one_slot(fence: Fence) -> None:
    holder = Holder("h", "m")
    assert await fence.claim("acme", "k", holder) is None
    assert await fence.claim("acme", "k", Holder("x", "y")) == holder
    name = fence.key("acme", "k")
    assert "{acme}" in name
    assert 0 < await fence.r.pttl(name) <= TTL.total_seconds() * 1000
    assert not await fence.release("acme", "k", Holder("x", "y"))
    assert await fence.release("acme", "k", holder)
    assert await fence.claim("acme", "k", Holder("x", "y")) is None


@pytest.fixture(scope="module")
def store(cql: Session, stack: Settings) -> CassandraStore:
    return CassandraStore(cql, stack).coalesce(max_keys=32, max_rows=64)


def claim(key: str, request_hash: str = "h1") -> Claim:
    return Claim("acme", key, request_hash, uuid.uuid4().hex, "topic", "{}",
                 datetime.now(UTC).replace(microsecond=0))


async def accept_like_the_api(store: CassandraStore, fence: Fence | None,
                              c: Claim) -> Reserved | Taken | ApiError:
    """Reserve, then (when the key is this request's) write the row as the API does."""
    try:
        out = await reserve(store, fence, c, client_key=True)
    except ApiError as exc:
        return exc
    if isinstance(out, Reserved):
        await store.write_all(out.writes)
    return out


async def test_one_owner_among_concurrent_requests_the_rest_answer_from_its_row(
        store: CassandraStore, fence: Fence) -> None:
    key = uuid.uuid4().hex
    claims = [claim(key) for _ in range(10)]
    outs = await asyncio.gather(*(accept_like_the_api(store, fence, c) for c in claims))
    owners = [c for c, o in zip(claims, outs, strict=True) if isinstance(o, Reserved)]
    assert len(owners) == 1, outs
    taken = [o for o in outs if isinstance(o, Taken)]
    assert len(taken) == 9, outs
    assert {o.row.message_id for o in taken} == {owners[0].message_id}


async def test_concurrent_requests_with_other_bodies_all_end_in_409(
        store: CassandraStore, fence: Fence) -> None:
    key = uuid.uuid4().hex
    claims = [claim(key, f"h{i}") for i in range(10)]
    outs = await asyncio.gather(*(accept_like_the_api(store, fence, c) for c in claims))
    owners = [c for c, o in zip(claims, outs, strict=True) if isinstance(o, Reserved)]
    assert len(owners) == 1, outs
    for c, o in zip(claims, outs, strict=True):
        if c is owners[0]:
            continue
        if isinstance(o, Taken):  # the API compares the row's hash: 409
            assert o.row.request_hash == owners[0].request_hash != c.request_hash
        else:
            assert isinstance(o, ApiError) and o.status == 409, o


async def test_the_transaction_sees_what_a_fence_wrote_and_a_fence_what_it_wrote(
        store: CassandraStore, fence: Fence) -> None:
    fenced = claim(uuid.uuid4().hex)
    assert isinstance(await accept_like_the_api(store, fence, fenced), Reserved)
    seen = await accept_like_the_api(store, None, claim(fenced.key))
    assert isinstance(seen, Taken) and seen.row.message_id == fenced.message_id

    by_lwt = claim(uuid.uuid4().hex)
    assert await accept_like_the_api(store, None, by_lwt) == Reserved(())
    seen = await accept_like_the_api(store, fence, claim(by_lwt.key))
    assert isinstance(seen, Taken) and seen.row.message_id == by_lwt.message_id


async def test_without_redis_the_key_is_reserved_by_transaction(store: CassandraStore) -> None:
    client = redis_client(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"),
                          timeout=0.25, pool_wait=0.25)
    dead = Fence(client, "x:", TTL, timeout_s=0.25, down_backoff_s=1.0)
    try:
        c = claim(uuid.uuid4().hex)
        assert await accept_like_the_api(store, dead, c) == Reserved(())
        row = await store.idempotency.get_reservation("acme", c.key)
        assert row is not None and row.message_id == c.message_id
        again = await accept_like_the_api(store, dead, claim(c.key))
        assert isinstance(again, Taken)
    finally:
        await client.aclose()
