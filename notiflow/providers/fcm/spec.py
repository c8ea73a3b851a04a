"""The FCM plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import EmulatorFactory, ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.fcm.client import FcmPush

    return await FcmPush.open(settings, timeout=timeout)


def _emulator() -> EmulatorFactory:
    from notiflow.providers.fcm.emulator import FcmEmulator

    return FcmEmulator


SPEC: Final = ProviderSpec("fcm", Channel.PUSH, _open, emulator=_emulator)
