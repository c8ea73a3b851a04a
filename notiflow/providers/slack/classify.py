"""Slack incoming-webhook answers → :class:`~notiflow.adapters.providers.common.Rule`.

Slack answers ``200`` ``ok`` (text) to a post it took, and otherwise a status with the error's
name as the whole plain-text body. A webhook whose app was removed, whose channel is gone or
archived, or whose workspace is disabled is dead: the recipient is deactivated (suppressed
``webhook_revoked``). A post the workspace's policy forbids is refused for good but the
webhook stays. ``rollup_error`` is Slack's own failure after the request arrived: AMBIGUOUS.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import HTTP_DEFAULTS, Rule, coded_rule

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS
DEAD: Final = Rule(_P, "invalid_recipient", deactivate=True)
INVALID_CONTENT: Final = Rule(_P, "invalid_content")
FORBIDDEN: Final = Rule(_P, "forbidden")

ERRORS: Final[Mapping[str, Rule]] = {
    "invalid_payload": INVALID_CONTENT,
    "no_text": INVALID_CONTENT,
    "too_many_attachments": INVALID_CONTENT,
    "invalid_blocks": INVALID_CONTENT,
    "invalid_blocks_format": INVALID_CONTENT,
    "invalid_attachments": INVALID_CONTENT,
    "msg_too_long": INVALID_CONTENT,
    "invalid_token": DEAD,
    "no_service": DEAD,
    "no_service_id": DEAD,
    "no_team": DEAD,
    "team_disabled": DEAD,
    "channel_not_found": DEAD,
    "channel_is_archived": DEAD,
    "user_not_found": DEAD,
    "action_prohibited": FORBIDDEN,
    "posting_to_general_channel_denied": FORBIDDEN,
    "rollup_error": Rule(_A, "server_error"),
}
"""Slack's error names (the body of a non-``200`` answer)."""

STATUSES: Final[Mapping[int, Rule]] = {
    **HTTP_DEFAULTS,
    400: INVALID_CONTENT,
    403: FORBIDDEN,
    404: DEAD,
    410: DEAD,
}
"""Statuses whose body names no error this table knows (defaults: ``common.HTTP_DEFAULTS``)."""


def error_name(body: bytes) -> str | None:
    """The error name of a Slack answer body (plain text; None when empty or not one word)."""
    text = body.decode("utf-8", "replace").strip()
    return text if text and text.replace("_", "").isalnum() and len(text) <= 64 else None


def classify_response(status: int, body: bytes) -> Rule:
    """The rule of a non-``200`` answer: its error name's row, else its status's."""
    return coded_rule(error_name(body), ERRORS, status, STATUSES)
