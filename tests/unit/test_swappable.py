"""A provider client replaced while sends are in flight: the in-flight send finishes on the
old client, later sends use the new one, the old one is closed once idle (or after its
drain time), and closing closes both."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.swappable import Swappable
from notiflow.schemas.enums import Channel, Tier
from tests.helpers import loop_turns

MESSAGE = OutboundMessage("m", 1, "acme", Channel.SMS, Tier.P1, "+14155550123", "hi")


class Held:
    """A client whose sends wait for ``release``; it records what it sent and if closed."""

    channel = Channel.SMS

    def __init__(self, name: str, provider_id: str = "twilio") -> None:
        self.name, self.provider_id = name, provider_id
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.shut = asyncio.Event()
        self.sent: list[str] = []

    @property
    def closed(self) -> bool:
        return self.shut.is_set()

    async def send(self, message: OutboundMessage) -> SendResult:
        self.entered.set()
        await self.release.wait()
        self.sent.append(message.message_id)
        now = datetime.now(UTC)
        return SendResult(Outcome.ACCEPTED, self.provider_id, now, now, self.name)

    async def aclose(self) -> None:
        self.shut.set()


async def swapped_mid_send(drain_s: float = 60.0
                           ) -> tuple[Held, Held, Swappable, asyncio.Task[SendResult]]:
    """A slot whose client was replaced while one send was in flight on it."""
    old, new = Held("old"), Held("new")
    slot = Swappable(old, drain_s=drain_s)
    pending = asyncio.create_task(slot.send(MESSAGE))
    await old.entered.wait()
    slot.swap(new)
    return old, new, slot, pending


async def test_in_flight_sends_finish_on_the_old_client_and_new_ones_use_the_new() -> None:
    old, new, slot, pending = await swapped_mid_send()
    new.release.set()
    assert (await slot.send(MESSAGE)).provider_message_id == "new"
    await loop_turns(3)
    assert not old.closed
    old.release.set()
    assert (await pending).provider_message_id == "old"
    await asyncio.wait_for(old.shut.wait(), 5)
    assert old.closed and not new.closed
    await slot.aclose()
    assert new.closed


async def test_a_stuck_old_client_is_closed_after_its_drain_time() -> None:
    old, _new, slot, pending = await swapped_mid_send(drain_s=0.05)
    await asyncio.wait_for(old.shut.wait(), 1)
    assert old.closed
    pending.cancel()
    await slot.aclose()


async def test_closing_closes_clients_still_draining() -> None:
    old, new, slot, pending = await swapped_mid_send()
    await slot.aclose()
    assert old.closed and new.closed
    pending.cancel()


async def test_only_the_same_account_can_replace_a_client() -> None:
    slot = Swappable(Held("old"))
    with pytest.raises(ValueError, match="vonage"):
        slot.swap(Held("x", provider_id="vonage"))
