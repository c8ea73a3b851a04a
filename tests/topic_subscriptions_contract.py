"""The contract of the :class:`~notiflow.adapters.ports.TopicSubscriptions` port, run against
the memory port (``tests/unit/test_topic_subscriptions.py``) and Cassandra
(``tests/integration/api/test_topics_api.py``), so the two cannot drift apart."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from notiflow.adapters.ports import TOPIC_BUCKETS, TopicSubscriptions, topic_bucket

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


async def everyone(port: TopicSubscriptions, tenant: str, topic: str,
                   page: int = 7) -> list[str]:
    """Every subscriber, read bucket by bucket in pages of ``page``."""
    out: list[str] = []
    for bucket in range(TOPIC_BUCKETS):
        after = None
        while got := await port.subscribers(tenant, topic, bucket, after, page):
            assert got == sorted(got) and all(topic_bucket(u) == bucket for u in got)
            out += got
            after = got[-1]
    return out


async def check_topic_subscriptions(port: TopicSubscriptions, tenant: str = "acme") -> None:
    """Every rule of the port, on topics and users of its own."""
    run = uuid.uuid4().hex[:8]
    topic, other = f"project-{run}", f"other-{run}"
    users = [f"u-{run}-{i:03d}" for i in range(60)]
    await port.subscribe(tenant, topic, users, T0)
    await port.subscribe(tenant, topic, users[:10], T0)
    await port.subscribe(tenant, other, users[:3], T0)
    await port.subscribe("other-tenant", topic, ["stranger"], T0)
    assert sorted(await everyone(port, tenant, topic)) == users
    assert await port.topics_of(tenant, users[0]) == sorted([topic, other])
    assert await port.topics_of(tenant, users[-1]) == [topic]

    await port.unsubscribe(tenant, topic, [*users[:5], "never-subscribed"])
    assert sorted(await everyone(port, tenant, topic)) == users[5:]
    assert await port.topics_of(tenant, users[0]) == [other]

    await port.forget_user(tenant, users[1])
    assert await port.topics_of(tenant, users[1]) == []
    assert users[1] not in await everyone(port, tenant, other)
    assert await everyone(port, "other-tenant", topic) == ["stranger"]
