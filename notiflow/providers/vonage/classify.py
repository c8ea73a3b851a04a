"""How Vonage's answers are classified: the per-message :data:`STATUSES` of a 2xx body (refined
for statuses 2 and 3 by the parameter the error text names, :data:`PARAMETERS`), the shared
HTTP tables (``common``) for other answers, and :func:`read_answer` for a whole 2xx body;
``docs/providers.md`` explains each row."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import HTTP_DEFAULTS, Rule, status_rule
from notiflow.adapters.providers.common import STATUS_CLASSES as STATUS_CLASSES

_T, _P = Outcome.TRANSIENT, Outcome.PERMANENT

STATUSES: Final[Mapping[str, Rule]] = {
    "1": Rule(_T, "rate_limited"),
    "2": Rule(_P, "rejected"),
    "3": Rule(_P, "rejected"),
    "4": Rule(_T, "auth_failed"),
    "5": Rule(_T, "server_error"),
    "6": Rule(_P, "unroutable"),
    "7": Rule(_P, "recipient_barred"),
    "8": Rule(_T, "account_inactive"),
    "9": Rule(_T, "quota_exceeded"),
    "10": Rule(_T, "rate_limited"),
    "11": Rule(_T, "misconfigured"),
    "12": Rule(_P, "invalid_content"),
    "13": Rule(_T, "server_error"),
    "14": Rule(_T, "auth_failed"),
    "15": Rule(_T, "misconfigured"),
    "16": Rule(_T, "misconfigured"),
    "19": Rule(_T, "misconfigured"),
    "20": Rule(_T, "misconfigured"),
    "22": Rule(_T, "misconfigured"),
    "23": Rule(_T, "misconfigured"),
    "29": Rule(_P, "unverified_recipient"),
    "32": Rule(_T, "misconfigured"),
    "33": Rule(_P, "deactivated_recipient", deactivate=True),
    "34": Rule(_P, "invalid_recipient"),
    "101": Rule(_P, "unsubscribed", deactivate=True),
}
"""Per-message ``status`` → rule. Account, credential and sender problems are TRANSIENT (a
platform misconfiguration must not FAIL messages; the breaker opens instead); so are throttling,
credit exhaustion and Vonage's own processing errors (5, 13: no message-id was assigned, nothing
was queued). An unknown status is :data:`UNKNOWN_STATUS`."""

UNKNOWN_STATUS: Final = Rule(_T, "unknown_status")

PARAMETERS: Final[Mapping[str, Rule]] = {
    "to": Rule(_P, "invalid_recipient"),
    "msisdn": Rule(_P, "invalid_recipient"),
    "text": Rule(_P, "invalid_content"),
    "body": Rule(_P, "invalid_content"),
    "udh": Rule(_P, "invalid_content"),
    "from": Rule(_T, "misconfigured"),
    "api_key": Rule(_T, "auth_failed"),
    "api_secret": Rule(_T, "auth_failed"),
    "sig": Rule(_T, "auth_failed"),
    "timestamp": Rule(_T, "auth_failed"),
    "callback": Rule(_T, "misconfigured"),
    "client-ref": Rule(_T, "misconfigured"),
    "type": Rule(_T, "misconfigured"),
    "ttl": Rule(_T, "misconfigured"),
    "status-report-req": Rule(_T, "misconfigured"),
    "message-class": Rule(_T, "misconfigured"),
}
"""For statuses 2 (missing) and 3 (invalid): the parameter named by ``error-text`` → rule.
Our own parameters (sender, credentials, callback) are misconfiguration, never the message's
fault."""

PARAMETER_STATUSES: Final = frozenset({"2", "3"})
_PARAMETER = re.compile(r"(?:missing|invalid)\s+(?:value\s+for\s+)?(?:parameter\s+)?"
                        r"[`'\"]?([a-z_-]+)[`'\"]?(?:\s+param)?", re.IGNORECASE)
_THROTTLE_WAIT = re.compile(r"please\s+wait\s*\[\s*(\d+)\s*\]", re.IGNORECASE)

HTTP_STATUSES: Final[Mapping[int, Rule]] = HTTP_DEFAULTS
"""HTTP status → rule for answers that are not a ``messages`` body (Vonage's edge, a proxy, a
wrong base URL), then :data:`STATUS_CLASSES`. 500 and 504 may come after the message was
queued: AMBIGUOUS. A 2xx without a usable ``messages`` list is AMBIGUOUS."""


def parameter_of(error_text: str | None) -> str | None:
    """The request parameter an ``error-text`` names (``"Missing to param"`` → ``"to"``)."""
    if not error_text:
        return None
    match = _PARAMETER.search(error_text)
    return match.group(1).lower() if match else None


def classify_status(status: str, error_text: str | None = None) -> Rule:
    """The rule for a refused message: the parameter named by ``error_text`` (statuses 2 and 3
    only), then :data:`STATUSES`, then :data:`UNKNOWN_STATUS`."""
    if status in PARAMETER_STATUSES:
        rule = PARAMETERS.get(parameter_of(error_text) or "")
        if rule is not None:
            return rule
    return STATUSES.get(status, UNKNOWN_STATUS)


def classify_http(status: int) -> Rule:
    """The rule for an HTTP answer without a ``messages`` body."""
    return status_rule(status, HTTP_STATUSES, STATUS_CLASSES)


def throttle_wait(error_text: str | None) -> float | None:
    """Seconds to wait from a status-1 ``error-text`` (``"Throughput Rate Exceeded - please
    wait [ 250 ] and retry"``: milliseconds); None when it names none."""
    match = _THROTTLE_WAIT.search(error_text or "")
    return int(match.group(1)) / 1000 if match else None


def messages_of(payload: Any) -> list[dict[str, Any]] | None:
    """The ``messages`` entries of a Vonage answer; None unless it is a non-empty list of
    objects that each carry a ``status``."""
    if not isinstance(payload, dict) or not isinstance(payload.get("messages"), list):
        return None
    parts: list[dict[str, Any]] = payload["messages"]
    if not parts or not all(isinstance(p, dict) and "status" in p for p in parts):
        return None
    return parts


@dataclass(frozen=True, slots=True)
class Answer:
    """What a 2xx body says: accepted (``message_id`` of the first accepted part) or refused
    (``rule``, with the first part's ``status`` and, when throttled, the wait it names)."""

    message_id: str | None = None
    rule: Rule | None = None
    status: str | None = None
    retry_after_s: float | None = None
    parts: int = 0
    accepted_parts: int = 0


def read_answer(payload: Any) -> Answer:
    """Interpret a 2xx body. Every part ``"0"``: accepted. Some parts ``"0"``: accepted too (the
    accepted parts go out; resending would duplicate them), with ``status`` of the first
    refused part. No part accepted: the first part's status decides. Not a ``messages`` body,
    or an accepted part without ``message-id``: AMBIGUOUS ``malformed_response``."""
    parts = messages_of(payload)
    if parts is None:
        return Answer(rule=STATUS_CLASSES[2])
    statuses = [str(p.get("status")) for p in parts]
    accepted = [p for p, s in zip(parts, statuses, strict=True) if s == "0"]
    if accepted:
        sid = accepted[0].get("message-id")
        if not isinstance(sid, str) or not sid:
            return Answer(rule=STATUS_CLASSES[2], parts=len(parts),
                          accepted_parts=len(accepted))
        refused = next((s for s in statuses if s != "0"), None)
        return Answer(message_id=sid, status=refused, parts=len(parts),
                      accepted_parts=len(accepted))
    text = parts[0].get("error-text")
    text = text if isinstance(text, str) else None
    rule = classify_status(statuses[0], text)
    wait = throttle_wait(text) if rule.reason == "rate_limited" else None
    return Answer(rule=rule, status=statuses[0], retry_after_s=wait, parts=len(parts))
