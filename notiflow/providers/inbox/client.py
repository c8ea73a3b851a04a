"""Delivery to an in-app inbox: the item is written to Cassandra (``InboxStore``), then
published on Redis (``InboxFeed``) for the user's live connections.

The write is the delivery: once it is confirmed, the send is ACCEPTED (provider message id =
the message id), and the item is in the inbox whether or not the user is online. Writing it
again (a retry after a timeout) rewrites the same row (its time is the message's acceptance
time, to the millisecond) and leaves its states alone, so nothing here is ever AMBIGUOUS. The
publish is best effort: a Redis failure costs only the live push (clients catch up).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from cassandra.cluster import Cluster

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.values import to_ms
from notiflow.adapters.inbox_store import InboxFeed, InboxItem, InboxStore
from notiflow.adapters.outages import CASSANDRA_DOWN, REDIS_DOWN
from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import seconds, utcnow
from notiflow.schemas.enums import Channel
from notiflow.schemas.messages import inapp_user
from notiflow.settings import Settings

log = logging.getLogger(__name__)

STORE_FAILURES: tuple[type[BaseException], ...] = (TimeoutError, *CASSANDRA_DOWN, OSError)


class InboxDelivery:
    """The INAPP channel's provider client."""

    channel = Channel.INAPP

    def __init__(self, provider_id: str, store: InboxStore, feed: InboxFeed, *,
                 timeout: float, cluster: Cluster | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.provider_id = provider_id
        self._store = store
        self._feed = feed
        self._timeout = timeout
        self._cluster = cluster
        self._clock = clock

    @classmethod
    async def open(cls, settings: Settings, *, timeout: float | timedelta) -> InboxDelivery:
        cluster, session = await asyncio.to_thread(connect, settings)
        return cls(settings.inbox.provider_id, InboxStore(session, settings),
                   InboxFeed.open(settings), timeout=seconds(timeout), cluster=cluster)

    def _result(self, outcome: Outcome, started: datetime, *, reason: str | None = None,
                error_code: str | None = None, pmid: str | None = None) -> SendResult:
        return SendResult(outcome, self.provider_id, started, self._clock(),
                          provider_message_id=pmid, reason=reason, error_code=error_code)

    async def send(self, message: OutboundMessage, *,
                   timeout: float | timedelta | None = None) -> SendResult:
        started = self._clock()
        recipient = message.recipient
        if not isinstance(recipient, str) or not recipient.startswith("inapp:"):
            return self._result(Outcome.PERMANENT, started, reason="invalid_recipient")
        item = InboxItem(message.tenant_id, inapp_user(recipient), message.message_id,
                         to_ms(message.accepted_at or started), message.tier.value,
                         message.category or "", message.attempt, message.subject,
                         message.body)
        limit = self._timeout if timeout is None else seconds(timeout)
        try:
            await asyncio.wait_for(self._store.put(item, started), limit)
        except STORE_FAILURES as exc:
            return self._result(Outcome.TRANSIENT, started, reason="store_unavailable",
                                error_code=type(exc).__name__)
        try:
            await self._feed.publish(item.tenant_id, item.user_id,
                                     {"type": "item", "item": item.view()})
        except REDIS_DOWN as exc:
            log.info("inbox: live push of %s skipped (%s); clients catch up",
                     message.message_id, type(exc).__name__)
        return self._result(Outcome.ACCEPTED, started, pmid=message.message_id)

    async def aclose(self) -> None:
        await self._feed.aclose()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.shutdown)
