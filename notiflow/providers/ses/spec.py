"""The SES plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.extras import needs
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    with needs("ses", "the SES adapter (SigV4 signing)"):
        from notiflow.providers.ses.client import SesEmail

    return await SesEmail.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec.of_package(__name__, Channel.EMAIL, _open, emulator="SesEmulator",
                                      dev=True, routes=True)
