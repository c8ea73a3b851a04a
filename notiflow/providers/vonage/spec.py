"""The Vonage plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec, imported, opener
from notiflow.providers.vonage import receipts, signature
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec(
    "vonage", Channel.SMS, opener(f"{__package__}.client", "VonageSms"),
    emulator=imported(f"{__package__}.emulator", "VonageEmulator"),
    dev_environment=imported(f"{__package__}.dev", "environment"),
    receipt_routes=imported(f"{__package__}.routes", "ROUTES"),
    receipts=receipts.dlr_receipt,
    verify=signature.check_receipt)
