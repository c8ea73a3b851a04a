"""The Teams plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import EmulatorFactory, ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.teams.client import TeamsWebhook

    return await TeamsWebhook.open(settings, timeout=timeout)


def _emulator() -> EmulatorFactory:
    from notiflow.providers.teams.emulator import TeamsEmulator

    return lambda _settings: TeamsEmulator()


SPEC: Final = ProviderSpec("teams", Channel.CHAT, _open, emulator=_emulator)
