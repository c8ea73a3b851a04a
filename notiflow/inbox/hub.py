"""The live connections of one ``notiflow inbox`` process, and the fan-out to them.

Each connection (a WebSocket or an event stream) has a bounded queue of frames and one task
writing them out. :class:`Hub` keeps the connections by their inbox's Redis channel
(``adapters/inbox_store.channel_key``); one pattern subscription per process (:func:`listen`)
hands every event of a connected inbox to its connections' queues, without waiting for any
client. A client that falls ``send_queue`` frames behind is closed (it reconnects and catches
up from the inbox), so a slow client never holds up the others. A user's connection beyond
``max_connections_per_user`` closes that user's oldest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable

from redis.asyncio.client import PubSub

from notiflow.adapters.outages import REDIS_DOWN

log = logging.getLogger(__name__)


class Connection:
    """One live client: frames queued by the hub, written by :meth:`pump`."""

    def __init__(self, channel: str, queue_size: int,
                 write: Callable[[bytes], Awaitable[None]], transport: str = "ws") -> None:
        self.channel = channel
        self.transport = transport
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(queue_size)
        self.closed = asyncio.Event()
        self.overflowed = False
        self._write = write

    def offer(self, frame: bytes) -> None:
        """Queue ``frame``; a full queue ends the connection (it catches up on reconnect)."""
        if self.closed.is_set():
            return
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            self.overflowed = True
            self.close()

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            with contextlib.suppress(asyncio.QueueFull):
                self.queue.put_nowait(None)

    async def pump(self) -> None:
        """Write queued frames until the connection is closed."""
        while not self.closed.is_set():
            frame = await self.queue.get()
            if frame is None or self.closed.is_set():
                return
            await self._write(frame)


class Hub:
    """Connections by inbox channel; ``delivered`` counts frames queued, ``overflowed`` the
    connections closed for falling behind."""

    def __init__(self, max_per_user: int) -> None:
        self.max_per_user = max_per_user
        self.by_channel: defaultdict[str, list[Connection]] = defaultdict(list)
        self.delivered = 0
        self.overflowed = 0

    def join(self, conn: Connection) -> None:
        conns = self.by_channel[conn.channel]
        conns.append(conn)
        while len(conns) > self.max_per_user:
            conns.pop(0).close()

    def leave(self, conn: Connection) -> None:
        self.overflowed += conn.overflowed
        conns = self.by_channel.get(conn.channel)
        if conns is None:
            return
        if conn in conns:
            conns.remove(conn)
        if not conns:
            del self.by_channel[conn.channel]

    @property
    def connections(self) -> int:
        return sum(len(c) for c in self.by_channel.values())

    def by_transport(self) -> dict[str, int]:
        counts: dict[str, int] = {"ws": 0, "sse": 0}
        for conns in self.by_channel.values():
            for c in conns:
                counts[c.transport] = counts.get(c.transport, 0) + 1
        return counts

    def dispatch(self, channel: str, frame: bytes) -> int:
        """Hand ``frame`` to every connection of ``channel``; how many got it."""
        conns = self.by_channel.get(channel)
        if not conns:
            return 0
        for conn in conns:
            conn.offer(frame)
        self.delivered += len(conns)
        return len(conns)


async def listen(pubsub: PubSub, pattern: str, hub: Hub, *,
                 retry_s: float = 1.0) -> None:
    """Feed ``hub`` from one pattern subscription until cancelled (resubscribing after a
    Redis failure; events published meanwhile are caught up by clients from the inbox)."""
    while True:
        try:
            await pubsub.psubscribe(pattern)
            async for msg in pubsub.listen():
                if msg.get("type") == "pmessage":
                    channel, data = msg["channel"], msg["data"]
                    hub.dispatch(channel.decode() if isinstance(channel, bytes) else channel,
                                 data.encode() if isinstance(data, str) else data)
        except REDIS_DOWN as exc:
            log.warning("inbox: subscription lost (%s); resubscribing", type(exc).__name__)
            await asyncio.sleep(retry_s)
