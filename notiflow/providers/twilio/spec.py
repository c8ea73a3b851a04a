"""The Twilio plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from typing import Final

from notiflow.adapters.providers.base import ProviderSpec
from notiflow.providers.twilio import receipts, signature
from notiflow.schemas.enums import Channel

SPEC: Final = ProviderSpec.of_package(
    __name__, Channel.SMS, "TwilioSms", emulator="TwilioEmulator", dev=True, routes=True,
    receipts=receipts.callback_receipt, verify=signature.check_callback)
