"""Provider requests shared by concurrent sends (bulk batching; ``docs/providers.md``).

:class:`Coalescer` is a :class:`~notiflow.adapters.providers.base.ProviderClient` over a
:class:`~notiflow.adapters.providers.base.BatchSender`: the sends that arrive within
``linger`` of the first (or until ``size`` have) go out through one ``send_batch``, and each
caller gets its own message's result. The dispatcher is unchanged: every message still
passes its quota, lease and cancel gate on its own, holds its own in-flight slot while its
request is out, and is classified on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import timedelta

from notiflow.adapters.providers.base import (
    BatchSender,
    OutboundMessage,
    ProviderClient,
    SendResult,
)
from notiflow.schemas.enums import Channel
from notiflow.telemetry import current_traceparent

log = logging.getLogger(__name__)

_Waiting = tuple[OutboundMessage, str | None, "asyncio.Future[SendResult]"]


class Coalescer:
    """Sends of one provider account, gathered into batches of at most ``size`` messages.

    Bound to the event loop of its first send. A batch goes out when it is full or
    ``linger`` after its first message arrived; :meth:`aclose` sends what is waiting."""

    def __init__(self, inner: BatchSender, size: int, linger: float | timedelta,
                 close: ProviderClient | None = None) -> None:
        if size < 2:
            raise ValueError("a batch holds at least two messages")
        self.inner = inner
        self.provider_id = inner.provider_id
        self.channel: Channel = inner.channel
        self.size = min(size, inner.max_batch)
        self.linger = linger.total_seconds() if isinstance(linger, timedelta) else linger
        self._close = close
        self._waiting: list[_Waiting] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flights: set[asyncio.Task[None]] = set()

    async def send(self, message: OutboundMessage) -> SendResult:
        """The result of ``message``, sent with the others that meet it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[SendResult] = loop.create_future()
        self._waiting.append((message, current_traceparent(), fut))
        if len(self._waiting) >= self.size:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger, self._flush)
        return await asyncio.shield(fut)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._waiting = self._waiting, []
        if batch:
            task = asyncio.get_running_loop().create_task(self._fly(batch))
            self._flights.add(task)
            task.add_done_callback(self._flights.discard)

    async def _fly(self, batch: list[_Waiting]) -> None:
        try:
            results = await self.inner.send_batch([m for m, _, _ in batch],
                                                  [t for _, t, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for {len(batch)} messages")
        except BaseException as exc:
            log.error("batch of %d to %s raised: %r", len(batch), self.provider_id, exc)
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception)
                                      else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)

    async def aclose(self) -> None:
        """Send what waits, wait for the requests out, then close the provider client."""
        self._flush()
        if self._flights:
            with contextlib.suppress(Exception):
                await asyncio.gather(*self._flights, return_exceptions=True)
        if self._close is not None:
            await self._close.aclose()


def coalesced(providers: Mapping[str, ProviderClient], size: int,
              linger: float | timedelta) -> dict[str, ProviderClient]:
    """``providers`` with every :class:`BatchSender` among them behind a :class:`Coalescer`
    of ``size`` (1: unchanged)."""
    if size < 2:
        return dict(providers)
    return {pid: Coalescer(client, size, linger, close=client)
            if isinstance(client, BatchSender) else client
            for pid, client in providers.items()}
