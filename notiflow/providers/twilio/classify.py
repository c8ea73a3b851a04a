"""How Twilio's answers are classified: :data:`ERROR_CODES` first, then the shared HTTP tables
(``common``); ``docs/providers.md`` explains each row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import HTTP_DEFAULTS, Rule, coded_rule
from notiflow.adapters.providers.common import STATUS_CLASSES as STATUS_CLASSES

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

ERROR_CODES: Final[Mapping[int, Rule]] = {
    # credentials and account wiring: a platform misconfiguration, never the message's fault
    20003: Rule(_T, "auth_failed"),
    20005: Rule(_T, "account_inactive"),
    20404: Rule(_T, "misconfigured"),
    21212: Rule(_T, "misconfigured"),
    21606: Rule(_T, "misconfigured"),
    # throttling and provider-side trouble
    20429: Rule(_T, "rate_limited"),
    21611: Rule(_T, "rate_limited"),
    20500: Rule(_A, "server_error"),
    20503: Rule(_T, "server_error"),
    # the recipient
    21211: Rule(_P, "invalid_recipient"),
    21265: Rule(_P, "invalid_recipient"),
    21266: Rule(_P, "invalid_recipient"),
    21604: Rule(_P, "invalid_recipient"),
    21614: Rule(_P, "not_mobile"),
    21635: Rule(_P, "not_mobile"),
    21612: Rule(_P, "unreachable_recipient"),
    21408: Rule(_P, "region_not_permitted"),
    21608: Rule(_P, "unverified_recipient"),
    21610: Rule(_P, "unsubscribed", deactivate=True),
    # the content
    21602: Rule(_P, "invalid_content"),
    21617: Rule(_P, "invalid_content"),
}
"""Twilio error code (``code`` of the error body) → rule; consulted first. A 500 (20500) on
message creation is AMBIGUOUS: Twilio documents that the message may have been created."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = HTTP_DEFAULTS
"""HTTP status → rule, for answers whose error code is absent or not in :data:`ERROR_CODES`;
``status // 100`` → rule (:data:`STATUS_CLASSES`) is the last resort."""


def classify_response(status: int, code: int | None) -> Rule:
    """The rule for a non-success answer: error code, then HTTP status, then status class."""
    return coded_rule(code, ERROR_CODES, status, HTTP_STATUSES, STATUS_CLASSES)


def error_code_of(payload: Any) -> int | None:
    """The integer ``code`` of a Twilio error body, if any."""
    if isinstance(payload, dict):
        code = payload.get("code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
        if isinstance(code, str) and code.isdigit():
            return int(code)
    return None
