"""The SendGrid plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import (
    EmulatorFactory,
    ProviderClient,
    ProviderSpec,
    ReceiptRoutes,
)
from notiflow.providers.sendgrid import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.sendgrid.client import SendGridEmail

    return await SendGridEmail.open(settings, timeout=timeout)


def _emulator() -> EmulatorFactory:
    from notiflow.providers.sendgrid.emulator import SendGridEmulator

    return SendGridEmulator


def _receipt_routes() -> ReceiptRoutes:
    from notiflow.providers.sendgrid.routes import ROUTES

    return ROUTES


SPEC: Final = ProviderSpec("sendgrid", Channel.EMAIL, _open,
                           emulator=_emulator,
                           receipt_routes=_receipt_routes,
                           receipts=receipts.event_receipt,
                           verify=signature.check_event_post)
