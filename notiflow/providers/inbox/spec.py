"""The inbox plug-in's :class:`~notiflow.adapters.providers.base.ProviderSpec`."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.providers.inbox.client import InboxDelivery

    return await InboxDelivery.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("inbox", Channel.INAPP, _open)
