"""Fixtures of the provider contract suite: the adapter under test (``adapter``) and the admin API
of its emulator (``emulator``) for the test's ``harness``, the session's provider settings for it,
and a loopback receiver of Twilio-style status callbacks.

No fixture here starts a process: the emulators are the session's one ``notiflow fakes``
(``fakes``, tests/conftest.py). ``harness`` is each test's own parameter (every test of the suite
parametrises it); ``receiver`` is module-scoped, one loopback listener in the test process per
module that asks for it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from notiflow.settings import Settings

# before the import below: assert_result's failures get pytest's introspection, as they did when
# it lived in the test module
pytest.register_assert_rewrite("tests.integration.contract.harness")

from tests.integration.contract.harness import (  # noqa: E402
    Emulator,
    Harness,
    Receiver,
    TimedClient,
    listening,
)


@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[Receiver]:
    async with listening(Receiver(), "/hooks/sms") as rec:
        yield rec


@pytest.fixture
async def emulator(fakes: str, harness: Harness) -> AsyncIterator[Emulator]:
    async with httpx.AsyncClient(timeout=30) as http:
        emu = Emulator(fakes, harness.name, http)
        await emu.reset()
        yield emu
        await emu.reset()


@pytest.fixture
def provider_settings(settings: Settings, harness: Harness, receiver: Receiver) -> Settings:
    """The session's provider settings, with SMS callbacks sent to this module's receiver."""
    return harness.configure(settings, {"callback_url": receiver.url})


@pytest.fixture
async def adapter(harness: Harness, provider_settings: Settings,
                  emulator: Emulator) -> AsyncIterator[TimedClient]:
    client = await harness.open(provider_settings, 5.0)
    yield client
    await client.aclose()
