"""Slack and Microsoft Teams incoming-webhook emulators (``notiflow fakes``; dev, tests,
benchmarks).

Slack: ``POST /slack/services/{team}/{bot}/{token}`` takes Slack's JSON (``text`` and/or
``blocks``) and answers ``200`` ``ok``, or a status with the error's name as plain text.
Teams: ``POST /teams/workflows/{...}`` (a Workflows webhook) answers ``202`` with no body, or a
status with ``{"error": {"code", "message"}}``; ``POST /teams/webhookb2/{...}`` (an Office 365
connector) answers ``200`` ``1``, and reports a throttled post (429) inside a ``200`` text as
connectors do. Both take a ``message`` activity with one Adaptive Card.

Knobs (``/_admin/{slack,teams}/config``): the common ones (latency, 5xx, 429 with
``Retry-After``, outage, accepted-then-hang) and ``pace_limit`` posts per ``pace_window_s`` per
webhook URL, past which a post is throttled as the real service throttles it (off: 0).

Magic tokens (the URL's last segment starts with): Slack ``revoked`` → 403 ``invalid_token``,
``gone`` → 404 ``no_service``, ``archived`` → 410 ``channel_is_archived``, ``prohibited`` →
403 ``action_prohibited``; Teams ``gone`` → 404 ``WorkflowNotFound`` (a connector: 410),
``unauthorized`` → 401 ``DirectApiAuthorizationRequired``. The statuses of the Teams rows are
this emulator's reading of Logic Apps' answers; the adapter classifies by code first.

Every post is recorded with its URL (``to``) and text; the adapter's ``X-Notiflow-Message``
header gives ``message_id`` and ``attempt``, and ``sid`` is that header's value.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any, Final

import orjson
from aiohttp import web
from pydantic import Field

from notiflow.adapters.providers.chat import MESSAGE_HEADER
from notiflow.fakes.common import (
    ACCEPTED,
    CommonKnobs,
    Emulator,
    MessageRecord,
    json_response,
    retry_after_text,
)

SLACK_MAGIC: Final[Mapping[str, tuple[int, str]]] = {
    "revoked": (403, "invalid_token"),
    "gone": (404, "no_service"),
    "archived": (410, "channel_is_archived"),
    "prohibited": (403, "action_prohibited"),
}
TEAMS_MAGIC: Final[Mapping[str, tuple[int, str]]] = {
    "gone": (404, "WorkflowNotFound"),
    "unauthorized": (401, "DirectApiAuthorizationRequired"),
}
MAX_TEAMS_BYTES: Final = 28 * 1024
"""Teams refuses a message larger than about 28 KB."""
CARD_TYPE: Final = "application/vnd.microsoft.card.adaptive"


class ChatKnobs(CommonKnobs):
    """The common knobs plus per-webhook throttling."""

    pace_limit: int = Field(0, ge=0, le=10_000)
    """Posts one webhook URL takes per ``pace_window_s``; more are throttled (0: no limit)."""
    pace_window_s: float = Field(1.0, gt=0, le=3600)


class ChatEmulator(Emulator[ChatKnobs]):
    """What both chat emulators share: correlation, records, knobs and throttling."""

    def __init__(self, name: str) -> None:
        super().__init__(name, ChatKnobs)
        self._posts: defaultdict[str, deque[float]] = defaultdict(deque)

    def reset(self) -> None:
        super().reset()
        self._posts.clear()

    def throttled(self, url: str, now: float) -> bool:
        """Whether a post to ``url`` now goes over ``pace_limit`` (a post counts only when
        taken)."""
        limit = self.knobs.pace_limit
        if not limit:
            return False
        posts = self._posts[url]
        while posts and posts[0] <= now - self.knobs.pace_window_s:
            posts.popleft()
        if len(posts) >= limit:
            return True
        posts.append(now)
        return False

    def recorder(self, request: web.Request, received_at: float, text: str | None) -> Any:
        header = request.headers.get(MESSAGE_HEADER)
        message_id, attempt = _correlation(header)
        url = str(request.url)

        def record(outcome: str, status: int, hang: bool = False) -> None:
            self.messages.add(MessageRecord(
                received_at, outcome, status, None, header if outcome == ACCEPTED else None,
                message_id, attempt, url, None, text, hang))

        return record


class SlackEmulator(ChatEmulator):
    """Slack's incoming webhooks."""

    def __init__(self) -> None:
        super().__init__("slack")

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/slack/services/{team}/{bot}/{token}", self.post),
                *self.admin_routes()]

    async def post(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        doc = _json(await request.read())
        record = self.recorder(request, received_at, _slack_text(doc))
        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503)
            return _text(503, "service_unavailable")
        magic = _magic(SLACK_MAGIC, request.match_info["token"])
        if magic is not None:
            record("invalid", magic[0])
            return _text(*magic)
        if self.draw(knobs.error_rate_429) or self.throttled(request.path, received_at):
            record("rate_limited", 429)
            return _text(429, "rate_limited",
                         {"Retry-After": retry_after_text(knobs.retry_after_s)})
        if self.draw(knobs.error_rate_5xx):
            status = self.rng.choice(knobs.statuses_5xx)
            record("server_error", status)
            return _text(status, "rollup_error" if status == 500 else "service_unavailable")
        invalid = _slack_invalid(doc)
        if invalid is not None:
            record("invalid", 400)
            return _text(400, invalid)
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200, hang)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return _text(200, "ok")


class TeamsEmulator(ChatEmulator):
    """Teams' Workflows webhooks and Office 365 connectors."""

    def __init__(self) -> None:
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
        doc = _json(raw)
        record = self.recorder(request, received_at, _card_text(doc))
        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503)
            return _teams_error(503, "ServiceUnavailable", "The service is unavailable.")
        magic = _magic(TEAMS_MAGIC, request.path.rsplit("/", 1)[-1])
        if magic is not None:
            record("invalid", 410 if connector and magic[0] == 404 else magic[0])
            if connector:
                return _text(410 if magic[0] == 404 else magic[0], "Webhook not found")
            return _teams_error(magic[0], magic[1], f"The request failed: {magic[1]}.")
        if self.draw(knobs.error_rate_429) or self.throttled(request.path, received_at):
            record("rate_limited", 429)
            if connector:
                return _text(200, "Webhook message delivery failed with error: Microsoft "
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
                return _text(400, "Bad payload received by generic incoming webhook.")
            return _teams_error(400, "InvalidRequestContent",
                                "The input body for trigger 'manual' of type 'Request' did "
                                "not match its schema definition.")
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200 if connector else 202, hang)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return _text(200, "1") if connector else web.Response(status=202)


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _text(status: int, text: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain", headers=headers)


def _teams_error(status: int, code: str, message: str,
                 headers: Mapping[str, str] | None = None) -> web.Response:
    return json_response(orjson.dumps({"error": {"code": code, "message": message}}), status,
                         headers)


def _magic(table: Mapping[str, tuple[int, str]], token: str) -> tuple[int, str] | None:
    return next((v for k, v in table.items() if token.startswith(k)), None)


def _correlation(header: str | None) -> tuple[str | None, int | None]:
    if not header:
        return None, None
    message_id, _, attempt = header.rpartition(":")
    return (message_id or None), int(attempt) if attempt.isdigit() else None


def _slack_invalid(doc: Any) -> str | None:
    """Slack's error name for a body it refuses; None when it takes it."""
    if not isinstance(doc, dict):
        return "invalid_payload"
    blocks = doc.get("blocks")
    if blocks is not None and (not isinstance(blocks, list) or not all(
            isinstance(b, dict) and isinstance(b.get("type"), str) for b in blocks)):
        return "invalid_blocks"
    text = doc.get("text")
    if not (isinstance(text, str) and text.strip()) and not blocks:
        return "no_text"
    return None


def _slack_text(doc: Any) -> str | None:
    """What the channel shows as the message's body: its ``section`` block, else ``text``."""
    if not isinstance(doc, dict):
        return None
    blocks = doc.get("blocks")
    for b in blocks if isinstance(blocks, list) else ():
        if isinstance(b, dict) and b.get("type") == "section" and isinstance(b.get("text"), dict):
            text = b["text"].get("text")
            return text if isinstance(text, str) else None
    text = doc.get("text")
    return text if isinstance(text, str) else None


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
