"""What the chat webhook adapters (Slack, Microsoft Teams) share: the message's recipient is the
URL they post to, checked against the provider's ``webhook_prefixes`` before anything is sent
(:mod:`notiflow.chat_hooks`), and since incoming webhooks return no message id, the accepted
post's provider message id is ``{message_id}:{attempt}``, which the request also carries in
``X-Notiflow-Message`` (for the receiving side's logs and the emulators)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import ClassVar, Final, Protocol, TypeVar

from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import HttpProvider, Rule
from notiflow.chat_hooks import served
from notiflow.schemas.enums import Channel

MESSAGE_HEADER: Final = "X-Notiflow-Message"
NOT_SERVED: Final = Rule(Outcome.PERMANENT, "recipient_not_served")
"""A recipient outside the provider's webhook prefixes: never posted to."""


class ChatConfig(Protocol):
    """A chat provider's settings section."""

    @property
    def provider_id(self) -> str: ...

    @property
    def webhook_prefixes(self) -> tuple[str, ...]: ...


CC = TypeVar("CC", bound=ChatConfig)


def post_id(message: OutboundMessage) -> str:
    """The provider message id of an accepted post: ``{message_id}:{attempt}``."""
    return f"{message.message_id}:{message.attempt}"


class ChatWebhook(HttpProvider[CC]):
    """An incoming-webhook adapter: :meth:`send` posts ``_encode(message)`` as JSON to the
    message's own URL (kept exactly as given) when one of ``webhook_prefixes`` serves it."""

    channel = Channel.CHAT
    warn_reasons: ClassVar[frozenset[str]] = frozenset()
    """The URL is the tenant's, not our configuration: nothing here warns."""

    @classmethod
    def _headers(cls, config: CC) -> dict[str, str]:
        return {"Content-Type": "application/json", "Accept": "*/*",
                "User-Agent": f"notiflow-{cls.name}/1"}

    async def send(self, message: OutboundMessage, *,
                   timeout: float | timedelta | None = None) -> SendResult:
        started: datetime = self._clock()
        recipient = message.recipient
        if not isinstance(recipient, str) or not served(recipient,
                                                        self._config.webhook_prefixes):
            return self._result(NOT_SERVED, message, started)
        body = self._encode(message)
        answer = await self._post(URL(recipient, encoded=True), body, self._limits(timeout),
                                  message, started,
                                  headers={MESSAGE_HEADER: post_id(message)})
        if isinstance(answer, SendResult):
            return answer
        return self._classify(answer, message, started)
