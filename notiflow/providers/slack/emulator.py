"""The Slack incoming-webhook emulator (``notiflow fakes``; shared parts in
:mod:`notiflow.fakes.chat`): ``POST /slack/services/{team}/{bot}/{token}`` takes Slack's JSON
(``text`` and/or ``blocks``) and answers ``200`` ``ok``, or a status with the error's name as
plain text. Magic tokens (the URL's last segment starts with): ``revoked`` → 403
``invalid_token``, ``gone`` → 404 ``no_service``, ``archived`` → 410 ``channel_is_archived``,
``prohibited`` → 403 ``action_prohibited``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web

from notiflow.fakes.chat import ChatEmulator, json_body, magic, text_response
from notiflow.fakes.common import ACCEPTED, retry_after_text
from notiflow.settings import Settings

SLACK_MAGIC: Final[Mapping[str, tuple[int, str]]] = {
    "revoked": (403, "invalid_token"),
    "gone": (404, "no_service"),
    "archived": (410, "channel_is_archived"),
    "prohibited": (403, "action_prohibited"),
}


class SlackEmulator(ChatEmulator):
    """Slack's incoming webhooks."""

    def __init__(self, settings: Settings | None = None) -> None:
        """``settings``: unused (an incoming webhook has no account to configure)."""
        super().__init__("slack")

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/slack/services/{team}/{bot}/{token}", self.post),
                *self.admin_routes()]

    async def post(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        doc = json_body(await request.read())
        record = self.recorder(request, received_at, _slack_text(doc))
        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503)
            return text_response(503, "service_unavailable")
        found = magic(SLACK_MAGIC, request.match_info["token"])
        if found is not None:
            record("invalid", found[0])
            return text_response(*found)
        if self.draw(knobs.error_rate_429) or self.throttled(request.path, received_at):
            record("rate_limited", 429)
            return text_response(429, "rate_limited",
                         {"Retry-After": retry_after_text(knobs.retry_after_s)})
        if self.draw(knobs.error_rate_5xx):
            status = self.rng.choice(knobs.statuses_5xx)
            record("server_error", status)
            return text_response(status, "rollup_error" if status == 500 else "service_unavailable")
        invalid = _slack_invalid(doc)
        if invalid is not None:
            record("invalid", 400)
            return text_response(400, invalid)
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200, hang)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return text_response(200, "ok")


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
