"""Operator read paths over Cassandra (``notiflow status``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.rows import AttemptRow, MessageEventRow, MessageRow
from notiflow.schemas.user_sends import UserSendRecord
from notiflow.settings import Settings


@asynccontextmanager
async def opened_store(settings: Settings) -> AsyncIterator[CassandraStore]:
    """A store on a session of its own, shut down on exit."""
    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        yield CassandraStore(session, settings)
    finally:
        cluster.shutdown()


async def message_history(
    settings: Settings, message_id: str
) -> tuple[MessageRow, list[AttemptRow], list[MessageEventRow]] | None:
    """(message row, attempts, status history) of one message, or None if unknown."""
    async with opened_store(settings) as store:
        msg = await store.messages.get_message(message_id)
        if msg is None:
            return None
        attempts, events = await asyncio.gather(store.delivery.attempts(message_id),
                                                store.messages.events(message_id))
        return msg, attempts, events


async def user_send(settings: Settings, message_id: str
                    ) -> tuple[UserSendRecord, dict[str, str | None]] | None:
    """(the decision, each of its messages' current status) of a send to a user, or None
    if unknown."""
    async with opened_store(settings) as store:
        record = await store.user_sends.get(message_id)
        if record is None:
            return None
        rows = await asyncio.gather(*(store.messages.get_message(leg.message_id)
                                      for leg in record.messages))
        return record, {leg.message_id: row.status if row else None
                        for leg, row in zip(record.messages, rows, strict=True)}
