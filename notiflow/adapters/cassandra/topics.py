"""Topic subscriptions (migration 0017): each written by topic (bucketed) and by user, so a
fan-out reads a topic in bounded pieces and an erasure finds a user's topics."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from notiflow.adapters.cassandra.session import Statements, Write
from notiflow.adapters.ports import topic_bucket

CONCURRENCY = 32


class CassandraTopics:
    """The :class:`~notiflow.adapters.ports.TopicSubscriptions` port over Cassandra."""

    def __init__(self, cql: Statements) -> None:
        self.cql = cql
        cql.prepare(STATEMENTS)

    async def subscribe(self, tenant_id: str, topic: str, user_ids: Sequence[str],
                        now: datetime) -> None:
        await self._each(
            [[("topic_add", (tenant_id, topic, topic_bucket(uid), uid, now)),
              ("user_topic_add", (tenant_id, uid, topic, now))]
             for uid in dict.fromkeys(user_ids)])

    async def unsubscribe(self, tenant_id: str, topic: str,
                          user_ids: Sequence[str]) -> None:
        await self._each(
            [[("topic_remove", (tenant_id, topic, topic_bucket(uid), uid)),
              ("user_topic_remove", (tenant_id, uid, topic))]
             for uid in dict.fromkeys(user_ids)])

    async def _each(self, per_user: list[list[Write]]) -> None:
        """Each user's writes as one small batch, :data:`CONCURRENCY` at a time (one batch
        of a thousand users' rows would pass Cassandra's batch size limit)."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(writes: list[Write]) -> None:
            async with gate:
                await self.cql.write_all(writes)

        await asyncio.gather(*(one(w) for w in per_user))

    async def subscribers(self, tenant_id: str, topic: str, bucket: int,
                          after: str | None, limit: int) -> list[str]:
        rows = await self.cql.run("topic_page", (tenant_id, topic, bucket, after or "",
                                                 limit))
        return [r["user_id"] for r in rows]

    async def topics_of(self, tenant_id: str, user_id: str) -> list[str]:
        return [r["topic"] for r in await self.cql.run("user_topics", (tenant_id, user_id))]

    async def forget_user(self, tenant_id: str, user_id: str) -> None:
        topics = await self.topics_of(tenant_id, user_id)
        await self.unsubscribe_all(tenant_id, user_id, topics)

    async def unsubscribe_all(self, tenant_id: str, user_id: str,
                              topics: Sequence[str]) -> None:
        await self.cql.write_all([
            *(("topic_remove", (tenant_id, t, topic_bucket(user_id), user_id))
              for t in topics),
            ("user_topics_forget", (tenant_id, user_id))])


STATEMENTS: dict[str, str] = {
    "topic_add": "INSERT INTO topic_subscribers (tenant_id, topic, bucket, user_id, "
                 "subscribed_at) VALUES (?, ?, ?, ?, ?)",
    "user_topic_add": "INSERT INTO user_topics (tenant_id, user_id, topic, subscribed_at) "
                      "VALUES (?, ?, ?, ?)",
    "topic_remove": "DELETE FROM topic_subscribers WHERE tenant_id = ? AND topic = ? "
                    "AND bucket = ? AND user_id = ?",
    "user_topic_remove": "DELETE FROM user_topics WHERE tenant_id = ? AND user_id = ? "
                         "AND topic = ?",
    "user_topics_forget": "DELETE FROM user_topics WHERE tenant_id = ? AND user_id = ?",
    "topic_page": "SELECT user_id FROM topic_subscribers WHERE tenant_id = ? AND topic = ? "
                  "AND bucket = ? AND user_id > ? LIMIT ?",
    "user_topics": "SELECT topic FROM user_topics WHERE tenant_id = ? AND user_id = ?",
}
