"""What the chat webhook adapters (Slack, Microsoft Teams) share: the message's recipient is the
URL they post to, checked against the provider's ``webhook_prefixes`` before anything is sent
(:mod:`notiflow.chat_hooks`), and since incoming webhooks return no message id, the accepted
post's provider message id is ``{message_id}:{attempt}``, which the request also carries in
``X-Notiflow-Message`` (for the receiving side's logs and the emulators).

A webhook URL is the tenant's endpoint, not the provider's: what it answers, how long it
takes and whether its host resolves are the tenant's doing (any Azure customer owns a
``*.logic.azure.com`` workflow that answers ``503`` at will). So a post's outcome counts
against the breaker of its tenant's endpoint (:func:`endpoint_breaker`), and the shared
provider breaker sees only :func:`provider_evidence`."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import ClassVar, Final, NamedTuple, Protocol, TypeVar

from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import HttpProvider, Rule
from notiflow.chat_hooks import parse_prefix, served, webhook_url
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

ENDPOINT_PREFIX: Final = "chat:"
"""Breaker ids of tenants' chat endpoints (``chat:<tenant>:<hash>``)."""
PROVIDER_FAILURES: Final = frozenset({"connect_error"})
"""Reasons that show the provider's own host failing: no connection could be set up to a
host every tenant's posts go to. A connection timeout is not one of them: it includes the
wait for a pooled connection, which a tenant's slow endpoint on that host can hold."""


class Evidence(NamedTuple):
    """What one outcome tells a breaker."""

    outcome: Outcome
    reason: str | None
    latency_s: float


def endpoint_breaker(tenant_id: str, url: str) -> str:
    """The breaker id of ``tenant_id``'s webhook ``url``: the URL is a credential, so only
    a hash of it is part of the id (and of the Redis key). Two tenants posting to one URL
    have a breaker each."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:32]
    return f"{ENDPOINT_PREFIX}{tenant_id}:{digest}"


def breaker_label(breaker_id: str) -> str:
    """A breaker id as a metric attribute: ``chat_endpoint`` for every tenant endpoint (one
    value, not one per URL), the id itself for a provider account."""
    return "chat_endpoint" if breaker_id.startswith(ENDPOINT_PREFIX) else breaker_id


def shared_host(url: str, prefixes: Iterable[str]) -> bool:
    """Whether ``url`` posts to a host a prefix names exactly (no ``*.`` wildcard): a host
    every tenant's posts to this provider go to, whose name no tenant chose."""
    try:
        host = webhook_url(url).hostname
    except ValueError:
        return False
    return any(not (p := parse_prefix(prefix)).wildcard and p.host == host
               for prefix in prefixes)


def provider_evidence(result: SendResult, url: str,
                      prefixes: Iterable[str]) -> Evidence | None:
    """What a chat post's ``result`` tells the shared provider breaker, None for nothing:

    - an answer the post was accepted or refused for good with: the provider's front door
      answered (a success, latency left out: a tenant's workflow may take its time);
    - a connection that could not be set up (:data:`PROVIDER_FAILURES`) to a
      :func:`shared_host`: a failure;
    - anything else (``5xx``, ``429``, timeouts, a lost connection, a host under a
      wildcard prefix that does not resolve): the tenant's endpoint, not the provider;
      a URL never posted to (``recipient_not_served``): nothing.
    """
    if result.reason == NOT_SERVED.reason:
        return None
    if result.outcome in (Outcome.ACCEPTED, Outcome.PERMANENT):
        return Evidence(result.outcome, result.reason, 0.0)
    if result.reason in PROVIDER_FAILURES and shared_host(url, prefixes):
        return Evidence(result.outcome, result.reason, 0.0)
    return None


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
