"""The contract of the :class:`~notiflow.adapters.ports.UserRecords` port, run against the
memory port (``tests/unit/test_user_directory.py``) and Cassandra
(``tests/integration/api/test_users_api.py``), so the two cannot drift apart."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from notiflow.adapters.ports import UserRecords
from notiflow.schemas.users import UserProfile

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


async def check_user_records(records: UserRecords, tenant: str = "acme") -> None:
    """Every rule of the port, each on a user of its own."""
    await _create_read_change(records, tenant, f"u-{uuid.uuid4().hex[:8]}")
    await _concurrent_changes_all_land(records, tenant, f"u-{uuid.uuid4().hex[:8]}")
    await _erase(records, tenant, f"u-{uuid.uuid4().hex[:8]}")


async def _create_read_change(records: UserRecords, tenant: str, uid: str) -> None:
    assert await records.get(tenant, uid) is None
    ana = UserProfile(phones=("+33612345678",), locale="fr")
    user, wrote = await records.change(tenant, uid, lambda _: ana, T0)
    assert wrote and user is not None
    assert (user.version, user.created_at, user.updated_at, user.profile()) == (1, T0, T0, ana)
    assert await records.get(tenant, uid) == user
    assert await records.get("other-tenant", uid) is None

    same, wrote = await records.change(tenant, uid, lambda _: None, T0 + timedelta(hours=1))
    assert not wrote and same == user

    later = T0 + timedelta(minutes=5)
    second, wrote = await records.change(
        tenant, uid, lambda cur: UserProfile(emails=("ana@example.com",)), later)
    assert wrote and second is not None
    assert (second.version, second.created_at, second.updated_at) == (2, T0, later)
    assert second.phones == () and second.emails == ("ana@example.com",)
    assert await records.get(tenant, uid) == second


async def _concurrent_changes_all_land(records: UserRecords, tenant: str, uid: str) -> None:
    await records.change(tenant, uid, lambda _: UserProfile(properties={"n": 0}), T0)

    def bump(current: UserProfile | None) -> UserProfile:
        assert current is not None
        n = current.properties["n"]
        assert isinstance(n, int)
        return UserProfile(properties={"n": n + 1})

    await asyncio.gather(*(records.change(tenant, uid, bump, T0) for _ in range(8)))
    user = await records.get(tenant, uid)
    assert user is not None
    assert (user.version, user.properties) == (9, {"n": 8})


async def _erase(records: UserRecords, tenant: str, uid: str) -> None:
    assert await records.erase(tenant, uid) is None
    user, _ = await records.change(tenant, uid, lambda _: UserProfile(locale="de"), T0)
    assert await records.erase(tenant, uid) == user
    assert await records.get(tenant, uid) is None
    assert await records.erase(tenant, uid) is None
    again, _ = await records.change(tenant, uid, lambda cur: UserProfile(locale="it"), T0)
    assert again is not None and again.version == 1
