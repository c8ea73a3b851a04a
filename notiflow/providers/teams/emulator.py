"""The Microsoft Teams incoming-webhook emulator (``notiflow fakes``; shared parts in
:mod:`notiflow.fakes.chat`): ``POST /teams/workflows/{...}`` (a Workflows webhook) answers
``202`` with no body, or a status with ``{"error": {"code", "message"}}``;
``POST /teams/webhookb2/{...}`` (an Office 365 connector) answers ``200`` ``1``, and reports a
throttled post (429) inside a ``200`` text as connectors do. Both take a ``message`` activity
with one Adaptive Card. Magic tokens: ``gone`` → 404 ``WorkflowNotFound`` (a connector: 410),
``unauthorized`` → 401 ``DirectApiAuthorizationRequired``; the statuses are this emulator's
reading of Logic Apps' answers, the adapter classifies by code first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson
from aiohttp import web

from notiflow.fakes.chat import ChatEmulator, json_body, magic, text_response
from notiflow.fakes.common import ACCEPTED, json_response, retry_after_text
from notiflow.settings import Settings

TEAMS_MAGIC: Final[Mapping[str, tuple[int, str]]] = {
    "gone": (404, "WorkflowNotFound"),
    "unauthorized": (401, "DirectApiAuthorizationRequired"),
}
MAX_TEAMS_BYTES: Final = 28 * 1024
"""Teams refuses a message larger than about 28 KB."""
CARD_TYPE: Final = "application/vnd.microsoft.card.adaptive"


class TeamsEmulator(ChatEmulator):
    """Teams' Workflows webhooks and Office 365 connectors."""

    def __init__(self, settings: Settings | None = None) -> None:
        """``settings``: unused (an incoming webhook has no account to configure)."""
        super().__init__("teams")

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/teams/workflows/{path:.+}", self.post),
                web.post("/teams/webhookb2/{path:.+}", self.post),
                *self.admin_routes()]

    async def post(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        connector = request.path.startswith("/teams/webhookb2/")
        raw = await request.read()
        doc = json_body(raw)
        record = self.recorder(request, received_at, _card_text(doc))
        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503)
            return _teams_error(503, "ServiceUnavailable", "The service is unavailable.")
        found = magic(TEAMS_MAGIC, request.path.rsplit("/", 1)[-1])
        if found is not None:
            record("invalid", 410 if connector and found[0] == 404 else found[0])
            if connector:
                return text_response(410 if found[0] == 404 else found[0], "Webhook not found")
            return _teams_error(found[0], found[1], f"The request failed: {found[1]}.")
        if self.draw(knobs.error_rate_429) or self.throttled(request.path, received_at):
            record("rate_limited", 429)
            if connector:
                return text_response(200, "Webhook message delivery failed with error: Microsoft "
                                  "Teams endpoint returned HTTP error 429 with ContextId "
                                  "tcid=0,server=emulator,cv=0.")
            return _teams_error(429, "WorkflowRequestsThrottled",
                                "Rate limit is exceeded. Try again later.",
                                {"Retry-After": retry_after_text(knobs.retry_after_s)})
        if self.draw(knobs.error_rate_5xx):
            status = self.rng.choice(knobs.statuses_5xx)
            record("server_error", status)
            return _teams_error(status, "InternalServerError" if status == 500
                                else "ServiceUnavailable", "The server had an error.")
        if len(raw) > MAX_TEAMS_BYTES:
            record("invalid", 413)
            return _teams_error(413, "MessageTooLarge", "The message is too large.")
        if _card_text(doc) is None:
            record("invalid", 400)
            if connector:
                return text_response(400, "Bad payload received by generic incoming webhook.")
            return _teams_error(400, "InvalidRequestContent",
                                "The input body for trigger 'manual' of type 'Request' did "
                                "not match its schema definition.")
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200 if connector else 202, hang)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return text_response(200, "1") if connector else web.Response(status=202)


def _teams_error(status: int, code: str, message: str,
                 headers: Mapping[str, str] | None = None) -> web.Response:
    return json_response(orjson.dumps({"error": {"code": code, "message": message}}), status,
                         headers)


def _card_text(doc: Any) -> str | None:
    """The text of the card's last ``TextBlock`` (the body; a subject comes before it), ""
    without one; None for a body that is no ``message`` activity with an Adaptive Card."""
    if not isinstance(doc, dict) or doc.get("type") != "message":
        return None
    attachments = doc.get("attachments")
    if not isinstance(attachments, list) or not attachments:
        return None
    first = attachments[0]
    content = first.get("content") if isinstance(first, dict) else None
    if (not isinstance(content, dict) or first.get("contentType") != CARD_TYPE
            or content.get("type") != "AdaptiveCard" or not isinstance(content.get("body"), list)):
        return None
    texts = [b["text"] for b in content["body"] if isinstance(b, dict)
             and b.get("type") == "TextBlock" and isinstance(b.get("text"), str)]
    return texts[-1] if texts else ""
