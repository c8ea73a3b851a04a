"""Operator read paths over Cassandra (``notiflow status``)."""

from __future__ import annotations

import asyncio

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.rows import AttemptRow, MessageEventRow, MessageRow
from notiflow.settings import Settings


async def message_history(
    settings: Settings, message_id: str
) -> tuple[MessageRow, list[AttemptRow], list[MessageEventRow]] | None:
    """(message row, attempts, status history) of one message, or None if unknown."""
    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        store = CassandraStore(session, settings)
        msg = await store.messages.get_message(message_id)
        if msg is None:
            return None
        attempts, events = await asyncio.gather(store.delivery.attempts(message_id),
                                                store.messages.events(message_id))
        return msg, attempts, events
    finally:
        cluster.shutdown()
