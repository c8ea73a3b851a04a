"""The Twilio plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec, imported, opener
from notiflow.providers.twilio import receipts, signature
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec(
    "twilio", Channel.SMS, opener(f"{__package__}.client", "TwilioSms"),
    emulator=imported(f"{__package__}.emulator", "TwilioEmulator"),
    dev_environment=imported(f"{__package__}.dev", "environment"),
    receipt_routes=imported(f"{__package__}.routes", "ROUTES"),
    receipts=receipts.callback_receipt,
    verify=signature.check_callback)
