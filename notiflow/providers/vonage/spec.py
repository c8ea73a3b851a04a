"""The Vonage plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import (
    EmulatorFactory,
    ProviderClient,
    ProviderSpec,
    ReceiptRoutes,
)
from notiflow.providers.vonage import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.vonage.client import VonageSms

    return await VonageSms.open(settings, timeout=timeout)


def _emulator() -> EmulatorFactory:
    from notiflow.providers.vonage.emulator import VonageEmulator

    return VonageEmulator


def _receipt_routes() -> ReceiptRoutes:
    from notiflow.providers.vonage.routes import ROUTES

    return ROUTES


SPEC: Final = ProviderSpec("vonage", Channel.SMS, _open,
                           emulator=_emulator,
                           receipt_routes=_receipt_routes,
                           receipts=receipts.dlr_receipt,
                           verify=signature.check_receipt)
