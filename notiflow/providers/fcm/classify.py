"""How FCM's answers are classified: :data:`ERROR_CODES` (the ``FcmError`` detail of a Google
JSON error) first, then the shared HTTP tables (``common``), and the token endpoint's answers
(:data:`TOKEN_STATUSES`); ``docs/providers.md`` explains each row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import HTTP_DEFAULTS, Rule, coded_rule
from notiflow.adapters.providers.common import STATUS_CLASSES as STATUS_CLASSES

FCM_ERROR_TYPE: Final = "type.googleapis.com/google.firebase.fcm.v1.FcmError"

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

ERROR_CODES: Final[Mapping[str, Rule]] = {
    "UNREGISTERED": Rule(_P, "unregistered", deactivate=True),
    "INVALID_ARGUMENT": Rule(_P, "rejected"),
    "SENDER_ID_MISMATCH": Rule(_P, "sender_id_mismatch"),
    "QUOTA_EXCEEDED": Rule(_T, "rate_limited"),
    "UNAVAILABLE": Rule(_T, "server_error"),
    "INTERNAL": Rule(_A, "server_error"),
    "THIRD_PARTY_AUTH_ERROR": Rule(_T, "misconfigured"),
}
"""FCM ``errorCode`` (the ``FcmError`` detail) → rule; consulted first. ``UNSPECIFIED_ERROR``
and unknown codes fall through to the HTTP status."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = HTTP_DEFAULTS
"""HTTP status → rule, for answers without a known FCM error code: 401 is a token FCM still
refuses after one refresh; 403 (PERMISSION_DENIED: the service account lacks the FCM role, or
the API is off) and 404 without ``UNREGISTERED`` (wrong project) are our configuration. A 2xx
without a message ``name`` is AMBIGUOUS (:data:`STATUS_CLASSES`)."""


TOKEN_STATUSES: Final[Mapping[int, Rule]] = {
    400: Rule(_T, "auth_failed"),
    401: Rule(_T, "auth_failed"),
    403: Rule(_T, "auth_failed"),
}
"""Token endpoint status → rule (``invalid_grant``, ``invalid_client``, ...). Anything else that
is not a token — 429, 5xx, a transport failure, a timeout — is TRANSIENT ``auth_unavailable``:
no message was sent yet, so nothing about the token phase is ever AMBIGUOUS."""

AUTH_UNAVAILABLE: Final = Rule(_T, "auth_unavailable")


def classify_response(status: int, error_code: str | None) -> Rule:
    """The rule for a non-success answer: FCM error code, then HTTP status, then status
    class."""
    return coded_rule(error_code, ERROR_CODES, status, HTTP_STATUSES, STATUS_CLASSES)


def error_of(payload: Any) -> tuple[str | None, str | None]:
    """(Google canonical ``status``, FCM ``errorCode``) of an error body; None where absent."""
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), dict):
        return None, None
    error = payload["error"]
    status = error.get("status") if isinstance(error.get("status"), str) else None
    code = None
    details = error.get("details")
    if isinstance(details, list):
        for detail in details:
            if (isinstance(detail, dict) and detail.get("@type") == FCM_ERROR_TYPE
                    and isinstance(detail.get("errorCode"), str)):
                code = detail["errorCode"]
                break
    return status, code
