"""What the Slack and Microsoft Teams incoming-webhook emulators share (``notiflow fakes``;
dev, tests, benchmarks); each is in its plug-in (``notiflow.providers.{slack,teams}.emulator``).

Knobs (``/_admin/{slack,teams}/config``): the common ones (latency, 5xx, 429 with
``Retry-After``, outage, accepted-then-hang) and ``pace_limit`` posts per ``pace_window_s`` per
webhook URL, past which a post is throttled as the real service throttles it (off: 0).

Every post is recorded with its URL (``to``) and text; the adapter's ``X-Notiflow-Message``
header gives ``message_id`` and ``attempt``, and ``sid`` is that header's value.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from pydantic import Field

from notiflow.adapters.providers.chat import MESSAGE_HEADER
from notiflow.fakes.common import (
    ACCEPTED,
    CommonKnobs,
    Emulator,
    MessageRecord,
)


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


def json_body(raw: bytes) -> Any:
    """The parsed JSON body; None when it is not JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def text_response(status: int, text: str,
                  headers: Mapping[str, str] | None = None) -> web.Response:
    """A ``text/plain`` answer."""
    return web.Response(status=status, text=text, content_type="text/plain", headers=headers)


def magic(table: Mapping[str, tuple[int, str]], token: str) -> tuple[int, str] | None:
    """The row of the first magic prefix ``token`` starts with."""
    return next((v for k, v in table.items() if token.startswith(k)), None)


def _correlation(header: str | None) -> tuple[str | None, int | None]:
    if not header:
        return None, None
    message_id, _, attempt = header.rpartition(":")
    return (message_id or None), int(attempt) if attempt.isdigit() else None
