"""Slack incoming webhooks, on Slack's wire format.

``POST {webhook URL}`` with a JSON body: ``text`` (the message, the subject in bold above it)
and, when the message has a subject and fits Slack's block limits, ``blocks``: a ``header``
with the subject and a ``section`` with the body in ``mrkdwn``. ``200`` ``ok`` is the post;
every other answer goes through :mod:`~notiflow.providers.slack.classify`, transport
failures through ``common.TRANSPORT_ERRORS``. Slack has no idempotency key: a timeout after the
request was sent is AMBIGUOUS.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Final

import orjson

from notiflow.adapters.providers.base import OutboundMessage, SendResult
from notiflow.adapters.providers.chat import ChatWebhook, post_id
from notiflow.adapters.providers.common import STATUS_CLASSES, HttpAnswer, retry_wait
from notiflow.providers.slack.classify import classify_response, error_name
from notiflow.providers.slack.config import SlackSettings

log = logging.getLogger(__name__)

MAX_HEADER: Final = 150
MAX_SECTION: Final = 3000
"""Slack's limits on a ``header`` block's and a ``section`` block's text."""


def payload(message: OutboundMessage) -> dict[str, Any]:
    """The JSON object Slack receives for ``message``."""
    subject, body = message.subject, message.body
    text = f"*{subject}*\n{body}" if subject else body
    doc: dict[str, Any] = {"text": text}
    if subject and body and len(subject) <= MAX_HEADER and len(body) <= MAX_SECTION:
        doc["blocks"] = [
            {"type": "header", "text": {"type": "plain_text", "text": subject}},
            {"type": "section", "text": {"type": "mrkdwn", "text": body}},
        ]
    return doc


class SlackWebhook(ChatWebhook[SlackSettings]):
    """Slack's incoming webhooks (every URL under ``slack.webhook_prefixes``)."""

    name = "slack"
    log = log

    def _encode(self, message: OutboundMessage) -> bytes:
        return orjson.dumps(payload(message))

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        if answer.status == 200:
            if error_name(answer.body) == "ok":
                return self._accepted(started, post_id(message))
            return self._result(STATUS_CLASSES[2], message, started, error_code="http_200")
        rule = classify_response(answer.status, answer.body)
        return self._result(rule, message, started,
                            error_code=error_name(answer.body) or f"http_{answer.status}",
                            retry_after_s=retry_wait(rule, answer.headers.get("Retry-After")))
