"""The in-app inbox as the INAPP channel's provider: ``client``
(:class:`~.client.InboxDelivery`) stores the item in the user's inbox and publishes it to the
user's live connections (``notiflow inbox``). Its receipts (seen → DELIVERED, read → OPENED)
come from ``notiflow inbox`` when the user's app marks the item."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.inbox.client import InboxDelivery

    return await InboxDelivery.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("inbox", Channel.INAPP, _open)
