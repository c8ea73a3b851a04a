"""Microsoft Teams incoming webhooks (the ``CHAT`` channel): ``client``
(:class:`~.client.TeamsWebhook`, the wire format) and ``classify`` (its tables). No delivery
receipts."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.teams.client import TeamsWebhook

    return await TeamsWebhook.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("teams", Channel.CHAT, _open)
