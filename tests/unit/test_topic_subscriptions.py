"""Topic subscriptions on the memory port (the port's contract), and the bucket of a user:
stable and spread."""

from __future__ import annotations

import asyncio
from collections import Counter

from notiflow.adapters.memory.topics import MemoryTopics
from notiflow.adapters.ports import TOPIC_BUCKETS, topic_bucket
from tests.topic_subscriptions_contract import check_topic_subscriptions


def test_the_memory_port_keeps_the_contract() -> None:
    asyncio.run(check_topic_subscriptions(MemoryTopics()))


def test_a_users_bucket_is_stable_and_buckets_are_evenly_filled() -> None:
    assert topic_bucket("user-42") == topic_bucket("user-42")
    counts = Counter(topic_bucket(f"user-{i}") for i in range(16_000))
    assert set(counts) == set(range(TOPIC_BUCKETS))
    assert max(counts.values()) < 1.15 * 16_000 / TOPIC_BUCKETS
