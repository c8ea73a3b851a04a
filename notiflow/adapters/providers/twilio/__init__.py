"""Twilio SMS: ``client`` (:class:`~.client.TwilioSms`, the wire format), ``classify`` (its
tables), ``receipts`` (status callbacks) and ``signature`` (``X-Twilio-Signature``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.adapters.providers.twilio import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.twilio.client import TwilioSms

    return await TwilioSms.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("twilio", Channel.SMS, _open, receipts=receipts.callback_receipt,
                           verify=signature.check_callback)
