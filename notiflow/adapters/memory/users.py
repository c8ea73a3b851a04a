"""The :class:`~notiflow.adapters.ports.UserRecords` port in memory: a dict under a lock,
with the compare-and-set semantics of the Cassandra store (``adapters/cassandra/users.py``)."""

from __future__ import annotations

import threading
from datetime import datetime

from notiflow.adapters.memory.clock import Clock
from notiflow.adapters.ports import UserChange
from notiflow.schemas.users import UserView, next_version


class MemoryUsers:
    """Users by ``(tenant_id, user_id)``; ``clock`` stamps writes made without ``now`` (to
    the millisecond, as Cassandra keeps them)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.rows: dict[tuple[str, str], UserView] = {}
        self._lock = threading.Lock()

    async def get(self, tenant_id: str, user_id: str) -> UserView | None:
        with self._lock:
            return self.rows.get((tenant_id, user_id))

    async def change(self, tenant_id: str, user_id: str, change: UserChange,
                     now: datetime | None = None) -> tuple[UserView | None, bool]:
        with self._lock:
            current = self.rows.get((tenant_id, user_id))
            wanted = change(current)
            if wanted is None:
                return current, False
            stamp = now or self.clock()
            stamp = stamp.replace(microsecond=stamp.microsecond // 1000 * 1000)
            new = next_version(current, wanted, user_id, stamp)
            self.rows[(tenant_id, user_id)] = new
            return new, True

    async def erase(self, tenant_id: str, user_id: str) -> UserView | None:
        with self._lock:
            return self.rows.pop((tenant_id, user_id), None)
