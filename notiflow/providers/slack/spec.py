"""The Slack plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import EmulatorFactory, ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.slack.client import SlackWebhook

    return await SlackWebhook.open(settings, timeout=timeout)


def _emulator() -> EmulatorFactory:
    from notiflow.providers.slack.emulator import SlackEmulator

    return lambda _settings: SlackEmulator()


SPEC: Final = ProviderSpec("slack", Channel.CHAT, _open, emulator=_emulator)
