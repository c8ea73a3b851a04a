"""Settling published acceptances off the response path.

Once Kafka acknowledged an ingest record, the acceptance is durable and its ``202`` is a
function of the record; what remains (the key marked ``ACCEPTED`` with that body, the outbox
row removed) is bookkeeping. The :class:`Settler` queues it and writes every settle queued
during one ``interval`` together, so the store's coalescer packs their rows into a few
unlogged batches instead of one request per acceptance.

Contract: a settle that fails, or one still queued when the process dies, leaves the key
``PENDING`` with its outbox row; the sweeper (or a replay) publishes the record again and
the send flow drops the duplicate by ``message_id``. While a settle is queued, a replay of
its key in this process is answered from the queue (:meth:`Settler.pending`), not published
again. :meth:`Settler.close` writes what is queued.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from notiflow.adapters.outages import CASSANDRA_DOWN

log = logging.getLogger("notiflow.gateway.settler")

Settle = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Queued:
    response: str
    """The ``202`` body the key is being marked ``ACCEPTED`` with."""
    settle: Settle


class Settler:
    """One API process's queue of settles, flushed every ``interval_s`` (0: at the next turn
    of the event loop)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._queue: dict[tuple[str, str], Queued] = {}
        self._writing: dict[tuple[str, str], Queued] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._queue) + len(self._writing)

    def add(self, tenant_id: str, key: str, response: str, settle: Settle) -> None:
        """Queue the settle of ``(tenant_id, key)``, whose ``202`` body is ``response``."""
        self._queue[(tenant_id, key)] = Queued(response, settle)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.interval_s, self._start_flush)

    def pending(self, tenant_id: str, key: str) -> str | None:
        """The ``202`` body of a settle of this key queued or being written, else None."""
        ident = (tenant_id, key)
        queued = self._queue.get(ident) or self._writing.get(ident)
        return None if queued is None else queued.response

    def _start_flush(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def flush(self) -> None:
        """Write every queued settle (at once: the coalescer batches them); failures are
        logged and left to the sweeper."""
        batch, self._queue = self._queue, {}
        if not batch:
            return
        self._writing.update(batch)
        outcomes = await asyncio.gather(*(q.settle() for q in batch.values()),
                                        return_exceptions=True)
        for (ident, queued), outcome in zip(batch.items(), outcomes, strict=True):
            if self._writing.get(ident) is queued:
                del self._writing[ident]
            if isinstance(outcome, CASSANDRA_DOWN):
                log.warning("settle of an acceptance deferred to the sweeper (%s)",
                            type(outcome).__name__)
            elif isinstance(outcome, BaseException):
                log.error("settle of an acceptance failed", exc_info=outcome)

    async def close(self) -> None:
        """Write what is queued and wait for flushes under way."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        await self.flush()
        if self._flushing:
            await asyncio.gather(*self._flushing, return_exceptions=True)
