"""The Twilio plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import (
    EmulatorFactory,
    ProviderClient,
    ProviderSpec,
    ReceiptRoutes,
)
from notiflow.providers.twilio import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.twilio.client import TwilioSms

    return await TwilioSms.open(settings, timeout=timeout)


def _emulator() -> EmulatorFactory:
    from notiflow.providers.twilio.emulator import TwilioEmulator

    return TwilioEmulator


def _receipt_routes() -> ReceiptRoutes:
    from notiflow.providers.twilio.routes import ROUTES

    return ROUTES


SPEC: Final = ProviderSpec("twilio", Channel.SMS, _open,
                           emulator=_emulator,
                           receipt_routes=_receipt_routes,
                           receipts=receipts.callback_receipt,
                           verify=signature.check_callback)
