"""The sample plug-in's spec."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from notiflow.adapters.providers.base import (
    EmulatorFactory,
    ProviderClient,
    ProviderSpec,
    ReceiptRoutes,
)
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from tests.sample_provider.client import SampleClient

    return SampleClient(settings.sample.provider_id)


def _emulator() -> EmulatorFactory:
    from tests.sample_provider.emulator import SampleEmulator

    return SampleEmulator


def _receipt_routes() -> ReceiptRoutes:
    from tests.sample_provider.routes import ROUTES

    return ROUTES


def _receipts(*_args: Any) -> None:
    return None


SPEC: Final = ProviderSpec("sample", Channel.SMS, _open, emulator=_emulator,
                           receipt_routes=_receipt_routes, receipts=_receipts)
