"""What an erasure forgets besides the user (:class:`~notiflow.adapters.user_directory.Forgetting`),
on the stores that keep it."""

from __future__ import annotations

from notiflow.adapters.cassandra.recipients import RecipientStore
from notiflow.adapters.inbox_store import InboxStore
from notiflow.adapters.ports import TopicSubscriptions
from notiflow.adapters.preferences import PreferenceStore
from notiflow.redact import recipient_hashes
from notiflow.schemas.preferences import PreferencesUpdate


class StoreForgetting:
    """Preference states through :class:`PreferenceStore` (so the reduced state is
    published to ``notify.preferences`` too), device rows, the inbox, topic
    subscriptions."""

    def __init__(self, preferences: PreferenceStore, recipients: RecipientStore,
                 inbox: InboxStore, topics: TopicSubscriptions) -> None:
        self.preferences = preferences
        self.recipients = recipients
        self.inbox = inbox
        self.topics = topics

    async def forget_address(self, tenant_id: str, recipient_hash: str) -> None:
        if await self.preferences.get_state(tenant_id, recipient_hash) is None:
            return
        await self.preferences.set_preferences(tenant_id, recipient_hash, PreferencesUpdate())

    async def forget_owner(self, tenant_id: str, owner_hash: str) -> None:
        await self.recipients.forget_devices(tenant_id, owner_hash, recipient_hashes)

    async def forget_inbox(self, tenant_id: str, user_id: str) -> None:
        await self.inbox.erase(tenant_id, user_id)

    async def forget_topics(self, tenant_id: str, user_id: str) -> None:
        await self.topics.forget_user(tenant_id, user_id)
