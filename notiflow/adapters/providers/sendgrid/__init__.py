"""SendGrid email: ``client`` (:class:`~.client.SendGridEmail`, the wire format),
``classify`` (its tables), ``receipts`` (Event Webhook events) and ``signature`` (the Event
Webhook's ECDSA signature)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.adapters.providers.sendgrid import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.sendgrid.client import SendGridEmail

    return await SendGridEmail.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("sendgrid", Channel.EMAIL, _open, receipts=receipts.event_receipt,
                           verify=signature.check_event_post)
