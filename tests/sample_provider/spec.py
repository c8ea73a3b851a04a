"""The sample plug-in's spec."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec, imported
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from tests.sample_provider.client import SampleClient

    return SampleClient(settings.sample.provider_id)


def _receipts(*_args: Any) -> None:
    return None


SPEC: Final = ProviderSpec("sample", Channel.SMS, _open,
                           emulator=imported(f"{__package__}.emulator", "SampleEmulator"),
                           receipt_routes=imported(f"{__package__}.routes", "ROUTES"),
                           dev_environment=imported(f"{__package__}.dev", "environment"),
                           receipts=_receipts)
