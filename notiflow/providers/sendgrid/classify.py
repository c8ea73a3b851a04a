"""How SendGrid's Mail Send answers are classified: :data:`FIELD_RULES` for a 400 first, then
:data:`HTTP_STATUSES` (the shared HTTP table plus SendGrid's own rows) and the shared status
classes; the wait after a 429; ``docs/providers.md`` explains each row."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import (
    HTTP_DEFAULTS,
    Rule,
    parse_retry_after,
    status_rule,
)
from notiflow.adapters.providers.common import STATUS_CLASSES as STATUS_CLASSES

_T, _P = Outcome.TRANSIENT, Outcome.PERMANENT

FIELD_RULES: Final[tuple[tuple[re.Pattern[str], Rule], ...]] = (
    (re.compile(r"personalizations\.\d+\.(to|cc|bcc)\b"), Rule(_P, "invalid_recipient")),
    (re.compile(r"from\b"), Rule(_T, "misconfigured")),
    (re.compile(r"reply_to\b"), Rule(_T, "misconfigured")),
    (re.compile(r"(personalizations\.\d+\.)?subject\b"), Rule(_P, "invalid_content")),
    (re.compile(r"content\b"), Rule(_P, "invalid_content")),
)
"""``errors[].field`` of a 400 answer (matched from its start) → rule; consulted first. SendGrid
has no error codes: the field names what was wrong. The sender fields are our configuration,
never the message's fault, so they are TRANSIENT and win over any other field of the answer."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = {
    **HTTP_DEFAULTS,
    406: Rule(_T, "misconfigured"),
    451: Rule(_T, "misconfigured"),
}
"""HTTP status → rule, for answers no :data:`FIELD_RULES` row matched: the shared table plus
406 and 451. 401 (bad API key) and 403 (key without the Mail Send scope, unverified sender
identity, temporary block after too many bad requests) are platform misconfiguration:
TRANSIENT. A 500 may come after the mail was queued (no idempotency key), so it is AMBIGUOUS
like Twilio's; 502/503 never reached the mail queue. A 2xx other than ``202`` +
``X-Message-Id`` is not an acceptance we can trust (:data:`STATUS_CLASSES`: AMBIGUOUS)."""


def field_rule(field: str) -> Rule | None:
    """The :data:`FIELD_RULES` rule of one ``errors[].field``, if any."""
    for pattern, rule in FIELD_RULES:
        if pattern.match(field):
            return rule
    return None


def classify_response(status: int, fields: Sequence[str | None] = ()) -> Rule:
    """The rule for a non-success answer: error fields (400 only; a TRANSIENT field wins, else
    the first known one), then HTTP status, then status class."""
    if status == 400:
        rules = [r for f in fields if f and (r := field_rule(f)) is not None]
        for rule in rules:
            if rule.outcome is _T:
                return rule
        if rules:
            return rules[0]
    return status_rule(status, HTTP_STATUSES, STATUS_CLASSES)


def error_fields_of(payload: Any) -> list[str | None]:
    """The ``field`` of every entry of a SendGrid ``{"errors": [...]}`` body."""
    if not isinstance(payload, dict) or not isinstance(payload.get("errors"), list):
        return []
    fields: list[str | None] = []
    for entry in payload["errors"]:
        if isinstance(entry, dict):
            field = entry.get("field")
            fields.append(field if isinstance(field, str) else None)
    return fields


def rate_limit_wait(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """Seconds to wait after a 429: ``Retry-After`` if present, else ``X-RateLimit-Reset``
    (Unix seconds at which the window resets) minus now; None if neither parses. Never
    negative."""
    wait = parse_retry_after(headers.get("Retry-After"), now=now)
    if wait is not None:
        return wait
    reset = headers.get("X-RateLimit-Reset")
    if not reset:
        return None
    try:
        at = float(reset.strip())
    except ValueError:
        return None
    return max(at - (now or datetime.now(UTC)).timestamp(), 0.0)
