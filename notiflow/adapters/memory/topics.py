"""Topic subscriptions in memory: the :class:`~notiflow.adapters.ports.TopicSubscriptions`
port for logic tests, ordered and bucketed as Cassandra keeps them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from notiflow.adapters.ports import topic_bucket


class MemoryTopics:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, datetime]] = {}
        """(tenant, topic) → user id → when subscribed."""

    async def subscribe(self, tenant_id: str, topic: str, user_ids: Sequence[str],
                        now: datetime) -> None:
        users = self.rows.setdefault((tenant_id, topic), {})
        for uid in user_ids:
            users[uid] = now

    async def unsubscribe(self, tenant_id: str, topic: str,
                          user_ids: Sequence[str]) -> None:
        users = self.rows.get((tenant_id, topic), {})
        for uid in user_ids:
            users.pop(uid, None)

    async def subscribers(self, tenant_id: str, topic: str, bucket: int,
                          after: str | None, limit: int) -> list[str]:
        users = sorted(u for u in self.rows.get((tenant_id, topic), {})
                       if topic_bucket(u) == bucket and u > (after or ""))
        return users[:limit]

    async def topics_of(self, tenant_id: str, user_id: str) -> list[str]:
        return sorted(t for (tid, t), users in self.rows.items()
                      if tid == tenant_id and user_id in users)

    async def forget_user(self, tenant_id: str, user_id: str) -> None:
        for (tid, _), users in self.rows.items():
            if tid == tenant_id:
                users.pop(user_id, None)
