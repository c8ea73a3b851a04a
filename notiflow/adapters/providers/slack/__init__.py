"""Slack incoming webhooks (the ``CHAT`` channel): ``client``
(:class:`~.client.SlackWebhook`, the wire format) and ``classify`` (its table). No delivery
receipts: an accepted post is in the channel."""

from __future__ import annotations

from datetime import timedelta
from typing import Final

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings


async def _open(settings: Settings, timeout: float | timedelta) -> ProviderClient:
    from notiflow.adapters.providers.slack.client import SlackWebhook

    return await SlackWebhook.open(settings, timeout=timeout)


SPEC: Final = ProviderSpec("slack", Channel.CHAT, _open)
