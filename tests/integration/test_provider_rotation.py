"""A send flow's provider account rotated while it runs, against the Twilio emulator (which
accepts only the account's current auth token, as Twilio does once the old one is
revoked): the client reopened by a credential reload sends with the new token."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from notiflow.adapters.providers import open_provider
from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.adapters.providers.swappable import Swappable
from notiflow.adapters.send_ports import reopen_providers
from notiflow.providers.twilio.emulator import TwilioEmulator
from notiflow.schemas.enums import Channel, Tier
from notiflow.secrets import Keyring
from notiflow.settings import Settings

pytestmark = pytest.mark.integration

SID = "AC" + "7" * 32
MESSAGE = OutboundMessage("m-rot", 1, "acme", Channel.SMS, Tier.P1, "+14155550123", "hi")


def account(token: str, base_url: str = "http://127.0.0.1:1/twilio") -> Settings:
    return Settings(twilio={"account_sid": SID, "auth_token": token, "base_url": base_url,
                            "status_callback_url": None})


@pytest.fixture
async def twilio() -> AsyncIterator[str]:
    """A Twilio emulator whose account's token is ``new``; its base URL."""
    app = web.Application()
    app.add_routes(TwilioEmulator(account("new")).routes())
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("/twilio"))
    await server.close()


async def test_a_reload_reopens_the_account_with_its_new_token(twilio: str) -> None:
    ring = Keyring(account("old", twilio))
    slot = Swappable(await open_provider(ring.settings, "twilio", timeout=5))
    refused = await slot.send(MESSAGE)
    assert refused.outcome is not Outcome.ACCEPTED and refused.reason == "auth_failed"
    change = ring.reload(account("new", twilio))
    assert change.applied == ("twilio",)
    await reopen_providers(ring.settings, change, {"twilio": slot}, Tier.P1)
    sent = await slot.send(MESSAGE)
    assert sent.outcome is Outcome.ACCEPTED, sent
    await slot.aclose()


async def test_credentials_that_do_not_open_keep_the_client_in_force(twilio: str) -> None:
    ring = Keyring(account("new", twilio))
    slot = Swappable(await open_provider(ring.settings, "twilio", timeout=5))
    before = slot.client
    change = ring.reload(ring.settings.model_copy(update={
        "twilio": ring.settings.twilio.model_copy(update={"auth_token": None})}))
    await reopen_providers(ring.settings, change, {"twilio": slot}, Tier.P1)
    assert slot.client is before
    assert (await slot.send(MESSAGE)).outcome is Outcome.ACCEPTED
    await slot.aclose()
