"""The SendGrid plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec
from notiflow.providers.sendgrid import receipts, signature
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec.of_package(
    __name__, Channel.EMAIL, "SendGridEmail", emulator="SendGridEmulator", dev=True, routes=True,
    receipts=receipts.event_receipt, verify=signature.check_event_post)
