"""The sample plug-in's client: accepts every message."""

from __future__ import annotations

from datetime import UTC, datetime

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.schemas.enums import Channel


class SampleClient:
    channel = Channel.SMS

    def __init__(self, provider_id: str) -> None:
        self.provider_id = provider_id

    async def send(self, message: OutboundMessage) -> SendResult:
        now = datetime.now(UTC)
        return SendResult(Outcome.ACCEPTED, self.provider_id, now, now,
                          provider_message_id=f"sample-{message.message_id}")

    async def aclose(self) -> None:
        return None
