"""The SendGrid plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec, imported, opener
from notiflow.providers.sendgrid import receipts, signature
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec(
    "sendgrid", Channel.EMAIL, opener(f"{__package__}.client", "SendGridEmail"),
    emulator=imported(f"{__package__}.emulator", "SendGridEmulator"),
    dev_environment=imported(f"{__package__}.dev", "environment"),
    receipt_routes=imported(f"{__package__}.routes", "ROUTES"),
    receipts=receipts.event_receipt,
    verify=signature.check_event_post)
