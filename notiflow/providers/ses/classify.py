"""How Amazon SES v2 ``SendEmail`` answers are classified: the error type (the
``x-amzn-ErrorType`` header of the REST-JSON protocol, else the body's ``__type`` / ``code``)
by :data:`ERROR_TYPES`, then :data:`HTTP_STATUSES` and the shared status classes;
``docs/providers.md`` ("SES") explains each row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import HTTP_DEFAULTS, Rule, coded_rule
from notiflow.adapters.providers.common import STATUS_CLASSES as STATUS_CLASSES

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

ERROR_TYPES: Final[Mapping[str, Rule]] = {
    "BadRequestException": Rule(_P, "rejected"),
    "MessageRejected": Rule(_P, "content_rejected"),
    "LimitExceededException": Rule(_P, "invalid_content"),
    "MailFromDomainNotVerifiedException": Rule(_T, "misconfigured"),
    "AccountSuspendedException": Rule(_T, "misconfigured"),
    "SendingPausedException": Rule(_T, "misconfigured"),
    "NotFoundException": Rule(_T, "misconfigured"),
    "AccessDeniedException": Rule(_T, "misconfigured"),
    "SignatureDoesNotMatch": Rule(_T, "auth_failed"),
    "InvalidSignatureException": Rule(_T, "auth_failed"),
    "IncompleteSignature": Rule(_T, "auth_failed"),
    "UnrecognizedClientException": Rule(_T, "auth_failed"),
    "InvalidClientTokenId": Rule(_T, "auth_failed"),
    "ExpiredTokenException": Rule(_T, "auth_failed"),
    "TooManyRequestsException": Rule(_T, "rate_limited"),
    "ThrottlingException": Rule(_T, "rate_limited"),
    "InternalFailure": Rule(_A, "server_error"),
    "ServiceUnavailable": Rule(_T, "server_error"),
}
"""SES error type → rule. The message's own faults (an address SES cannot parse, content it
refuses, a message over its size limit) are PERMANENT; the account's state (an unverified
MAIL FROM domain, a suspended or paused account, a missing configuration set, a key without
``ses:SendEmail``) is platform misconfiguration, never the message's: TRANSIENT. A bad
signature or unknown key is ``auth_failed``. ``InternalFailure`` may come after the mail was
queued (SES has no idempotency key): AMBIGUOUS."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = {**HTTP_DEFAULTS, 403: Rule(_T, "auth_failed")}
"""HTTP status → rule for answers without a known error type: the shared table, with 403
(SES's answer to a bad signature or key) as ``auth_failed``."""


def error_type(header: str | None, payload: Any) -> str | None:
    """The SES error type: the ``x-amzn-ErrorType`` header up to its first ``:``, else the
    body's ``__type`` (after a ``#``) or ``code``."""
    if header:
        return header.split(":", 1)[0].strip() or None
    if isinstance(payload, dict):
        for key in ("__type", "code", "Code"):
            value = payload.get(key)
            if isinstance(value, str) and value:
                return value.rsplit("#", 1)[-1]
    return None


UNVERIFIED: Final = Rule(_T, "misconfigured")
"""``MessageRejected`` for an identity the account has not verified (its message says so):
the sender is our configuration, not the message's fault."""


def classify_response(status: int, kind: str | None, message: str | None = None) -> Rule:
    """The rule for a non-success answer: an unverified identity, its error type, then its
    HTTP status."""
    if kind == "MessageRejected" and message and "not verified" in message.lower():
        return UNVERIFIED
    return coded_rule(kind, ERROR_TYPES, status, HTTP_STATUSES, STATUS_CLASSES)


def error_message(payload: Any) -> str | None:
    """The ``message`` (or ``Message``) of an SES error body."""
    if isinstance(payload, dict):
        for key in ("message", "Message"):
            value = payload.get(key)
            if isinstance(value, str):
                return value
    return None
