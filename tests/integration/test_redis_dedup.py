"""The send dedup's content claims in Redis (``adapters/redis_dedup.py``), against the memory
port that mirrors them (``adapters/memory/leases.py``)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from notiflow.adapters.redis_dedup import DedupStore
from notiflow.correlation import CorrelationKeys

pytestmark = pytest.mark.integration

WINDOW = timedelta(minutes=1)


async def test_a_content_claim_is_released_only_by_the_message_that_holds_it(
        client: aioredis.Redis) -> None:
    store = DedupStore(client, "us", f"dedup{uuid.uuid4().hex[:10]}.",
                       keys=CorrelationKeys((b"d" * 32,)))
    key = store.content_key("acme", "fp")
    assert await store.claim_content([(key, "msg_12")], WINDOW) == [None]
    await store.release_content([(key, "msg_1")])
    assert await store.claim_content([(key, "msg_2")], WINDOW) == ["msg_12"]
    await store.release_content([(key, "msg_12")])
    assert await store.claim_content([(key, "msg_2")], WINDOW) == [None]
