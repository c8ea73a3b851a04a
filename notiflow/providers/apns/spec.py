"""The APNs plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings

CLIENT_MODULE: Final = "notiflow.providers.apns.client"


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    try:
        from notiflow.providers.apns.client import ApnsPush
    except ModuleNotFoundError as exc:
        if exc.name != CLIENT_MODULE:
            raise
        raise ValueError("the APNs adapter is not installed in this build") from exc
    client: ProviderClient = await ApnsPush.open(settings, timeout=timeout)
    return client


SPEC: Final = ProviderSpec.of_package(__name__, Channel.PUSH, _open, emulator="ApnsEmulator",
                                      dev=True)
