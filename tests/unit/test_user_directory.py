"""Users on the memory port: the port's contract, then the directory's rules: every change
published after it is stored (a newer version stored meanwhile too), nothing written when
nothing changes, and an erasure that forgets every address before the user and ends with a
tombstone."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from notiflow.adapters.kafka_io import DeliveryFailed, OutRecord
from notiflow.adapters.memory.users import MemoryUsers
from notiflow.adapters.user_directory import UserDirectory
from notiflow.redact import recipient_hash, user_hash
from notiflow.schemas.users import UserPatch, UserProfile
from tests.fakes import Producer
from tests.user_records_contract import check_user_records

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
IOS = "b2" * 32
TOPIC = "notify.users"


def values(producer: Producer) -> list[dict[str, Any] | None]:
    return [orjson.loads(r.value) if r.value is not None else None for r in producer.records]


class Forgetting:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def forget_address(self, tenant_id: str, recipient_hash: str) -> None:
        self.log.append(f"address {recipient_hash}")

    async def forget_owner(self, tenant_id: str, owner_hash: str) -> None:
        self.log.append(f"owner {owner_hash}")

    async def forget_inbox(self, tenant_id: str, user_id: str) -> None:
        self.log.append(f"inbox {user_id}")

    async def forget_topics(self, tenant_id: str, user_id: str) -> None:
        self.log.append(f"topics {user_id}")


def directory() -> tuple[UserDirectory, MemoryUsers, Producer, list[str]]:
    records, producer, log = MemoryUsers(lambda: NOW), Producer(), []
    return UserDirectory(records, producer, TOPIC, Forgetting(log)), records, producer, log


def ana() -> UserProfile:
    return UserProfile(phones=("+33612345678",), emails=("ana@example.com",),
                       devices=({"platform": "ios", "token": IOS},),  # type: ignore[arg-type]
                       locale="fr")


def test_the_memory_port_keeps_the_contract() -> None:
    asyncio.run(check_user_records(MemoryUsers(lambda: NOW)))


def test_a_new_user_is_stored_then_published_without_addresses() -> None:
    users, _, producer, _ = directory()
    user, created = asyncio.run(users.put("acme", "u-1", ana()))
    assert created and user.version == 1
    [record] = producer.records
    assert (record.topic, record.key) == (TOPIC, b"acme:u-1")
    assert record.value is not None
    for address in (b"+33612345678", b"ana@example.com", IOS.encode()):
        assert address not in record.value
    state = values(producer)[0]
    assert state is not None
    assert state["channels"]["SMS"] == [recipient_hash("acme", "+33612345678")]
    assert state["channels"]["PUSH"] == [recipient_hash("acme", f"ios:{IOS}")]
    assert (state["version"], state["locale"]) == (1, "fr")


def test_the_same_profile_again_writes_nothing_and_publishes_again() -> None:
    users, _, producer, _ = directory()
    asyncio.run(users.put("acme", "u-1", ana()))
    user, created = asyncio.run(users.put("acme", "u-1", ana()))
    assert not created and user.version == 1
    assert [v["version"] for v in values(producer) if v] == [1, 1]


def test_a_patch_changes_a_stored_user_and_misses_an_unknown_one() -> None:
    users, _, producer, _ = directory()
    assert asyncio.run(users.patch("acme", "nobody", UserPatch(locale="de"))) is None
    assert producer.records == []
    asyncio.run(users.put("acme", "u-1", ana()))
    user = asyncio.run(users.patch("acme", "u-1", UserPatch(locale="de")))
    assert user is not None and (user.version, user.locale, user.phones) == (
        2, "de", ("+33612345678",))
    unchanged = asyncio.run(users.patch("acme", "u-1", UserPatch(locale="de")))
    assert unchanged is not None and unchanged.version == 2


def test_a_newer_version_stored_while_publishing_is_published_too() -> None:
    users, records, producer, _ = directory()
    original = producer.produce

    async def racing(record: OutRecord) -> None:
        await original(record)
        if len(producer.records) == 1:
            await records.change("acme", "u-1", lambda _: UserProfile(locale="it"))

    producer.produce = racing  # type: ignore[method-assign]
    asyncio.run(users.put("acme", "u-1", ana()))
    assert [(v or {}).get("version") for v in values(producer)] == [1, 2]
    assert (values(producer)[-1] or {}).get("locale") == "it"


def test_an_erasure_forgets_every_address_and_the_users_preferences_then_the_user() -> None:
    users, records, producer, log = directory()
    asyncio.run(users.put("acme", "u-1", ana()))
    assert asyncio.run(users.erase("acme", "u-1")) is True
    phone, email = (recipient_hash("acme", k) for k in ("+33612345678", "ana@example.com"))
    token = recipient_hash("acme", f"ios:{IOS}")
    own = user_hash("acme", "u-1")
    assert log == [f"address {phone}", f"owner {phone}", f"address {email}",
                   f"owner {email}", f"address {token}", f"address {own}", "inbox u-1",
                   "topics u-1"]
    assert asyncio.run(records.get("acme", "u-1")) is None
    last = producer.records[-1]
    assert (last.key, last.value) == (b"acme:u-1", None)
    assert asyncio.run(users.erase("acme", "u-1")) is False


def test_a_change_the_broker_refused_is_stored_and_published_by_repeating_it() -> None:
    users, records, producer, _ = directory()
    producer.up = False
    with pytest.raises(DeliveryFailed):
        asyncio.run(users.put("acme", "u-1", ana()))
    stored = asyncio.run(records.get("acme", "u-1"))
    assert stored is not None and stored.version == 1
    producer.up = True
    user, created = asyncio.run(users.put("acme", "u-1", ana()))
    assert (created, user.version) == (False, 1)
    assert [(v or {}).get("version") for v in values(producer)] == [1]
