"""The SES plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import (
    EmulatorFactory,
    ProviderClient,
    ProviderSpec,
    ReceiptRoutes,
)
from notiflow.extras import needs
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    with needs("ses", "the SES adapter (SigV4 signing)"):
        from notiflow.providers.ses.client import SesEmail

    return await SesEmail.open(settings, timeout=timeout)


def _emulator() -> EmulatorFactory:
    from notiflow.providers.ses.emulator import SesEmulator

    return SesEmulator


def _receipt_routes() -> ReceiptRoutes:
    from notiflow.providers.ses.routes import ROUTES

    return ROUTES


SPEC: Final = ProviderSpec("ses", Channel.EMAIL, _open,
                           emulator=_emulator,
                           receipt_routes=_receipt_routes)
