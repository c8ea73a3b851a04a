"""SendGrid v3 Mail Send (email) adapter, on SendGrid's real wire format.

``POST {base_url}/v3/mail/send`` with ``Authorization: Bearer <API key>`` and a JSON body: one
personalization addressed to the recipient, ``from``, ``subject``, one ``text/plain`` content
block and ``custom_args`` carrying ``message_id`` and ``attempt``. SendGrid answers ``202`` with
an empty body and the ``X-Message-Id`` header: that is the provider's acceptance.

Every other answer, and every transport failure, is mapped to an :class:`Outcome` through the
tables of :mod:`~notiflow.adapters.providers.sendgrid.classify` and the shared transport table;
``docs/providers.md`` explains each row. SendGrid has no idempotency key for Mail Send: a
timeout after the request was sent is AMBIGUOUS and cannot be settled by resending with a key.
SendGrid echoes ``custom_args`` as top-level keys of every Event Webhook event, which is how a
later ``processed`` / ``delivered`` event settles it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

import aiohttp
import orjson
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import HttpAnswer, HttpProvider, utcnow
from notiflow.adapters.providers.sendgrid.classify import (
    STATUS_CLASSES,
    classify_response,
    error_fields_of,
    rate_limit_wait,
)
from notiflow.schemas.enums import Channel
from notiflow.settings import SendGridSettings
from notiflow.telemetry import current_traceparent

log = logging.getLogger(__name__)

MAIL_SEND_PATH: Final = "/v3/mail/send"


class SendGridEmail(HttpProvider[SendGridSettings]):
    """One SendGrid account as a :class:`~notiflow.adapters.providers.base.ProviderClient`
    (opened and bounded as :class:`~notiflow.adapters.providers.common.HttpProvider` says)."""

    channel = Channel.EMAIL
    name = "sendgrid"
    log = log
    answer_headers = ("X-Message-Id", "Retry-After", "X-RateLimit-Reset")

    def __init__(self, config: SendGridSettings, session: aiohttp.ClientSession, *,
                 timeout: float, connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if config.api_key is None:
            raise ValueError("sendgrid.api_key is not configured")
        super().__init__(config, session, timeout=timeout, connect_timeout=connect_timeout,
                         clock=clock)
        self._url = URL(config.base_url.rstrip("/") + MAIL_SEND_PATH)
        self._from: dict[str, str] = {"email": config.from_email}
        if config.from_name:
            self._from["name"] = config.from_name

    @classmethod
    def _headers(cls, config: SendGridSettings) -> dict[str, str]:
        """``Authorization: Bearer <API key>``; ``ValueError`` when ``sendgrid.api_key`` is not
        configured."""
        if config.api_key is None:
            raise ValueError("sendgrid.api_key is not configured")
        return {"Authorization": f"Bearer {config.api_key.get_secret_value()}",
                "Content-Type": "application/json", "Accept": "application/json",
                "User-Agent": "notiflow-sendgrid/1"}

    def payload(self, message: OutboundMessage) -> dict[str, Any]:
        """The Mail Send body SendGrid receives for ``message`` (``subject`` omitted when the
        message has none: SendGrid then rejects it as invalid content)."""
        body: dict[str, Any] = {
            "personalizations": [{"to": [{"email": str(message.recipient)}]}],
            "from": self._from,
            "content": [{"type": "text/plain", "value": message.body}],
            "custom_args": {"message_id": message.message_id,
                            "attempt": str(message.attempt)},
        }
        if trace := current_traceparent():
            body["custom_args"]["traceparent"] = trace
        if message.subject is not None:
            body["subject"] = message.subject
        return body

    def _encode(self, message: OutboundMessage) -> bytes:
        return orjson.dumps(self.payload(message))

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """``202`` with ``X-Message-Id`` is accepted; anything else goes through the tables."""
        status, headers = answer.status, answer.headers
        if status == 202 and headers.get("X-Message-Id"):
            return self._accepted(started, headers["X-Message-Id"])
        if 200 <= status < 300:
            return self._result(STATUS_CLASSES[2], message, started, error_code=f"http_{status}")
        fields = error_fields_of(answer.json())
        rule = classify_response(status, fields)
        wait = (rate_limit_wait(headers, now=self._clock())
                if rule.outcome is Outcome.TRANSIENT else None)
        named = next((f for f in fields if f), None)
        return self._result(rule, message, started,
                            error_code=f"http_{status}:{named}" if named else f"http_{status}",
                            retry_after_s=wait)
