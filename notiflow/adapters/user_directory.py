"""Users: every change written to Cassandra, then published; an erasure forgets the user's
addresses everywhere the platform keeps them, then the user.

1. A write is a compare-and-set on the user's ``version`` (:class:`UserRecords`); once it
   returns, every ``LOCAL_QUORUM`` reader sees it.
2. The user's :class:`UserState` (no address, only recipient hashes) is published to the
   compacted ``notify.users`` (``acks=all``), then the user is read back and any newer
   version published too, so the topic's last record of a user is never older than
   Cassandra's once every writer has finished (as ``adapters/preferences.py`` does).
3. An erasure first forgets what is kept by the user's addresses (their preference states
   are reduced to their suppression, a hashed trace that keeps a bounced or unsubscribed
   address suppressed; the devices registered under their phones and emails; the user's
   own preferences; their inbox; their topic subscriptions),
   then deletes the user and publishes a tombstone. Each step is idempotent, so an erasure
   that failed part way is completed by repeating it; history keeps only hashes and masked
   forms.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.ports import UserRecords
from notiflow.adapters.preferences import RecordProducer
from notiflow.redact import recipient_hash, recipient_hashes, user_recipient_key
from notiflow.schemas.enums import Channel
from notiflow.schemas.messages import SCHEMA_VERSION
from notiflow.schemas.users import UserPatch, UserProfile, UserState, UserView, user_key

MAX_PUBLISH_ROUNDS = 5


class Forgetting(Protocol):
    """What the platform keeps by a user's addresses, forgotten at erasure."""

    async def forget_address(self, tenant_id: str, recipient_hash: str) -> None:
        """Reduce the address's preference state to its suppression (none: no state)."""
        ...

    async def forget_owner(self, tenant_id: str, owner_hash: str) -> None:
        """Forget the device tokens registered under a phone number or email address."""
        ...

    async def forget_inbox(self, tenant_id: str, user_id: str) -> None: ...

    async def forget_topics(self, tenant_id: str, user_id: str) -> None:
        """Remove the user from every topic they follow."""
        ...


def user_state(tenant_id: str, user: UserView,
               hashing: Callable[[str, str], str] = recipient_hash) -> UserState:
    """What ``notify.users`` carries of a user: the recipient hash of each address."""
    channels = {channel: tuple(hashing(tenant_id, key) for key in keys)
                for channel, keys in user.addresses().items()}
    return UserState(tenant_id=tenant_id, user_id=user.user_id, version=user.version,
                     updated_at=user.updated_at, locale=user.locale, timezone=user.timezone,
                     in_app=user.in_app, channels=channels)


def state_record(topic: str, state: UserState) -> OutRecord:
    return OutRecord(topic=topic, key=state.key.encode(),
                     value=state.model_dump_json().encode(),
                     headers=[("tenant_id", state.tenant_id.encode()),
                              ("schema_version", str(SCHEMA_VERSION).encode())])


def tombstone(topic: str, tenant_id: str, user_id: str) -> OutRecord:
    return OutRecord(topic=topic, key=user_key(tenant_id, user_id).encode(), value=None,
                     headers=[("tenant_id", tenant_id.encode())])


class UserDirectory:
    """Reads, changes and erasure of users (module doc)."""

    def __init__(self, records: UserRecords, producer: RecordProducer, topic: str,
                 forgetting: Forgetting) -> None:
        self.records = records
        self.producer = producer
        self.topic = topic
        self.forgetting = forgetting

    async def get(self, tenant_id: str, user_id: str) -> UserView | None:
        return await self.records.get(tenant_id, user_id)

    async def put(self, tenant_id: str, user_id: str, profile: UserProfile,
                  now: datetime | None = None) -> tuple[UserView, bool]:
        """Store ``profile`` as the whole user; (the user, whether it is new). A profile
        equal to the stored one writes nothing and is published again (a repair)."""
        created = False

        def change(current: UserProfile | None) -> UserProfile | None:
            nonlocal created
            created = current is None
            if isinstance(current, UserView) and current.profile() == profile:
                return None
            return profile

        user, _ = await self.records.change(tenant_id, user_id, change, now)
        if user is None:
            raise RuntimeError("a user write stored nothing")
        await self.publish(tenant_id, user)
        return user, created

    async def patch(self, tenant_id: str, user_id: str, patch: UserPatch,
                    now: datetime | None = None) -> UserView | None:
        """Apply ``patch`` to the stored user; None when there is no such user. Raises
        ValueError when the patched profile is not valid."""
        def change(current: UserProfile | None) -> UserProfile | None:
            if not isinstance(current, UserView):
                return None
            wanted = patch.applied_to(current.profile())
            return None if wanted == current.profile() else wanted

        user, _ = await self.records.change(tenant_id, user_id, change, now)
        if user is not None:
            await self.publish(tenant_id, user)
        return user

    async def erase(self, tenant_id: str, user_id: str) -> bool:
        """Forget the user and what is kept by their addresses (module doc); False when
        there is no such user."""
        user = await self.records.get(tenant_id, user_id)
        if user is None:
            return False
        for channel, keys in user.addresses().items():
            for key in keys:
                for h in recipient_hashes(tenant_id, key):
                    await self.forgetting.forget_address(tenant_id, h)
                    if channel in (Channel.SMS, Channel.EMAIL):
                        await self.forgetting.forget_owner(tenant_id, h)
        for h in recipient_hashes(tenant_id, user_recipient_key(user_id)):
            await self.forgetting.forget_address(tenant_id, h)
        await self.forgetting.forget_inbox(tenant_id, user_id)
        await self.forgetting.forget_topics(tenant_id, user_id)
        await self.records.erase(tenant_id, user_id)
        await self.producer.produce(tombstone(self.topic, tenant_id, user_id))
        return True

    async def publish(self, tenant_id: str, user: UserView) -> None:
        """Publish ``user``'s state, then any newer version stored meanwhile."""
        current = user
        for _ in range(MAX_PUBLISH_ROUNDS):
            await self.producer.produce(state_record(self.topic, user_state(tenant_id,
                                                                            current)))
            latest = await self.records.get(tenant_id, current.user_id)
            if latest is None or latest.version <= current.version:
                return
            current = latest
