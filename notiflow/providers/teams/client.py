"""Microsoft Teams incoming webhooks (Workflows and Office 365 connectors), on Teams' wire
format.

``POST {webhook URL}`` with a ``message`` activity carrying one Adaptive Card (version 1.4):
the subject as a bold ``TextBlock`` and the body as a wrapping ``TextBlock``. Both kinds of
webhook take this body. ``202`` (a workflow) or ``200`` ``1`` (a connector) is the post; the
rest goes through :mod:`~notiflow.providers.teams.classify`. A workflow's ``202``
means the workflow started: its own run may still fail, and Teams tells nobody. No idempotency
key: a timeout after the request was sent is AMBIGUOUS.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Final

import orjson

from notiflow.adapters.providers.base import OutboundMessage, SendResult
from notiflow.adapters.providers.chat import ChatWebhook, post_id
from notiflow.adapters.providers.common import STATUS_CLASSES, HttpAnswer, retry_wait
from notiflow.providers.teams.classify import (
    classify_response,
    embedded_rule,
    embedded_status,
    error_code_of,
)
from notiflow.providers.teams.config import TeamsSettings

log = logging.getLogger(__name__)

CARD_TYPE: Final = "application/vnd.microsoft.card.adaptive"
CARD_SCHEMA: Final = "http://adaptivecards.io/schemas/adaptive-card.json"
CARD_VERSION: Final = "1.4"


def card(message: OutboundMessage) -> dict[str, Any]:
    """The Adaptive Card of ``message``."""
    blocks: list[dict[str, Any]] = []
    if message.subject:
        blocks.append({"type": "TextBlock", "text": message.subject, "weight": "Bolder",
                       "size": "Medium", "wrap": True})
    blocks.append({"type": "TextBlock", "text": message.body, "wrap": True})
    return {"$schema": CARD_SCHEMA, "type": "AdaptiveCard", "version": CARD_VERSION,
            "body": blocks}


def payload(message: OutboundMessage) -> dict[str, Any]:
    """The JSON object Teams receives for ``message``."""
    return {"type": "message",
            "attachments": [{"contentType": CARD_TYPE, "contentUrl": None,
                             "content": card(message)}]}


class TeamsWebhook(ChatWebhook[TeamsSettings]):
    """Teams' incoming webhooks (every URL under ``teams.webhook_prefixes``)."""

    name = "teams"
    log = log

    def _encode(self, message: OutboundMessage) -> bytes:
        return orjson.dumps(payload(message))

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        status = answer.status
        if status == 202 or (status == 200 and answer.body.strip() == b"1"):
            return self._accepted(started, post_id(message))
        if status == 200:
            embedded = embedded_status(answer.body)
            if embedded is None:
                return self._result(STATUS_CLASSES[2], message, started, error_code="http_200")
            rule = embedded_rule(embedded)
            return self._result(rule, message, started, error_code=f"http_200_{embedded}",
                                retry_after_s=retry_wait(rule, answer.headers.get("Retry-After")))
        if 200 < status < 300:
            return self._result(STATUS_CLASSES[2], message, started, error_code=f"http_{status}")
        code = error_code_of(answer.json())
        rule = classify_response(status, code)
        return self._result(rule, message, started, error_code=code or f"http_{status}",
                            retry_after_s=retry_wait(rule, answer.headers.get("Retry-After")))
