"""Vonage SMS: ``client`` (:class:`~.client.VonageSms`, the wire format), ``classify`` (its
tables and the answer reader), ``receipts`` (DLRs, ``client-ref``) and ``signature`` (``sig``
of signed DLRs)."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.adapters.providers.vonage import receipts, signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.vonage.client import VonageSms

    return await VonageSms.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("vonage", Channel.SMS, _open, receipts=receipts.dlr_receipt,
                           verify=signature.check_receipt)
