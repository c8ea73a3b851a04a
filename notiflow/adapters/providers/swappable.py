"""A provider account whose client is replaced while the flow runs (its credentials were
rotated): sends that start after :meth:`Swappable.swap` use the new client; the old one is
closed once the sends it had in flight have finished (or after ``drain_s``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from notiflow.adapters.providers.base import OutboundMessage, ProviderClient, SendResult
from notiflow.schemas.enums import Channel

log = logging.getLogger("notiflow.providers")


@dataclass(eq=False)
class _Slot:
    client: ProviderClient
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.client.aclose()


class Swappable:
    """:class:`~notiflow.adapters.providers.base.ProviderClient` in front of a replaceable
    client of one provider account."""

    def __init__(self, client: ProviderClient, *, drain_s: float = 60.0) -> None:
        self.provider_id: str = client.provider_id
        self.channel: Channel = client.channel
        self.drain_s = drain_s
        self._slot = _Slot(client)
        self._retiring: dict[asyncio.Task[None], _Slot] = {}

    @property
    def client(self) -> ProviderClient:
        return self._slot.client

    async def send(self, message: OutboundMessage) -> SendResult:
        slot = self._slot
        slot.in_flight += 1
        slot.idle.clear()
        try:
            return await slot.client.send(message)
        finally:
            slot.in_flight -= 1
            if slot.in_flight == 0:
                slot.idle.set()

    def swap(self, client: ProviderClient) -> None:
        """New sends go to ``client``; the replaced client is closed in the background once
        idle."""
        if client.provider_id != self.provider_id:
            raise ValueError(f"{client.provider_id!r} cannot replace {self.provider_id!r}")
        old, self._slot = self._slot, _Slot(client)
        task = asyncio.get_running_loop().create_task(self._retire(old))
        self._retiring[task] = old
        task.add_done_callback(lambda t: self._retiring.pop(t, None))

    async def _retire(self, slot: _Slot) -> None:
        if slot.in_flight:
            try:
                await asyncio.wait_for(slot.idle.wait(), self.drain_s)
            except TimeoutError:
                log.warning("%s: %d sends still in flight on the replaced client after "
                            "%.0f s; closing it", self.provider_id, slot.in_flight,
                            self.drain_s)
        await slot.close()

    async def aclose(self) -> None:
        """Close the client in force and every replaced one still draining."""
        for task, slot in list(self._retiring.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await slot.close()
        await self._slot.close()
