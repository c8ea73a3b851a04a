"""How APNs answers and transport failures are classified: :data:`REASONS` first, then
:data:`HTTP_STATUSES` and :data:`STATUS_CLASSES` (derived from the shared HTTP tables), and
:data:`CONNECT_PHASE_ERRORS` / :data:`TRANSPORT_ERRORS` for ``pyreqwest`` failures;
``docs/providers.md`` explains each row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pyreqwest import exceptions as rq

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import (
    CLIENT_ERROR,
    HTTP_DEFAULTS,
    UNEXPECTED_STATUS,
    Rule,
    coded_rule,
    matching_row,
    parse_json,
)
from notiflow.adapters.providers.common import STATUS_CLASSES as HTTP_STATUS_CLASSES

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

REASONS: Final[Mapping[str, Rule]] = {
    # the device token
    "BadDeviceToken": Rule(_P, "invalid_recipient", deactivate=True),
    "Unregistered": Rule(_P, "unregistered", deactivate=True),
    "ExpiredToken": Rule(_P, "unregistered", deactivate=True),
    "DeviceTokenNotForTopic": Rule(_P, "token_not_for_topic"),
    "MissingDeviceToken": Rule(_P, "invalid_recipient"),
    # the content, or headers derived from this message
    "PayloadEmpty": Rule(_P, "invalid_content"),
    "PayloadTooLarge": Rule(_P, "invalid_content"),
    "BadCollapseId": Rule(_P, "rejected"),
    "BadExpirationDate": Rule(_P, "rejected"),
    # our configuration or our wire format: every message would fail alike
    "BadTopic": Rule(_T, "misconfigured"),
    "MissingTopic": Rule(_T, "misconfigured"),
    "TopicDisallowed": Rule(_T, "misconfigured"),
    "BadMessageId": Rule(_T, "misconfigured"),
    "BadPriority": Rule(_T, "misconfigured"),
    "DuplicateHeaders": Rule(_T, "misconfigured"),
    "InvalidPushType": Rule(_T, "misconfigured"),
    "BadPath": Rule(_T, "misconfigured"),
    "MethodNotAllowed": Rule(_T, "misconfigured"),
    "Forbidden": Rule(_T, "misconfigured"),
    "UnrelatedKeyIdInToken": Rule(_T, "misconfigured"),
    # credentials (ExpiredProviderToken is first refreshed and retried once)
    "ExpiredProviderToken": Rule(_T, "auth_failed"),
    "InvalidProviderToken": Rule(_T, "auth_failed"),
    "MissingProviderToken": Rule(_T, "auth_failed"),
    "BadCertificate": Rule(_T, "auth_failed"),
    "BadCertificateEnvironment": Rule(_T, "auth_failed"),
    "TooManyProviderTokenUpdates": Rule(_T, "auth_failed"),
    # throttling and Apple-side trouble
    "TooManyRequests": Rule(_T, "rate_limited"),
    "IdleTimeout": Rule(_T, "connection_lost"),
    "InternalServerError": Rule(_A, "server_error"),
    "ServiceUnavailable": Rule(_T, "server_error"),
    "Shutdown": Rule(_T, "server_error"),
}
"""APNs ``reason`` → rule; consulted first. Unknown reasons fall through to the status."""

HTTP_STATUSES: Final[Mapping[int, Rule]] = {
    **{status: rule for status, rule in HTTP_DEFAULTS.items() if status not in (401, 408)},
    403: Rule(_T, "auth_failed"),
    410: Rule(_P, "unregistered", deactivate=True),
}
"""HTTP status → rule, for answers without a known ``reason``: the shared table without 401
and 408 (not APNs answers; they fall to the status class), with 403 as a refused provider
token and 410 as a dead device token."""

STATUS_CLASSES: Final[Mapping[int, Rule]] = {**HTTP_STATUS_CLASSES, 2: UNEXPECTED_STATUS}
"""``status // 100`` → rule; the last resort (a 2xx other than 200 is AMBIGUOUS
``unexpected_status``)."""

CONNECT_PHASE: Final = "client error (Connect)"
"""The cause hyper reports for a failure while setting up the connection (TCP, TLS, ALPN)."""

CONNECT_PHASE_ERRORS: Final[tuple[tuple[type[BaseException], Rule], ...]] = (
    (rq.ConnectTimeoutError, Rule(_T, "connect_timeout")),
    (rq.ConnectError, Rule(_T, "connect_error")),
)
"""Exception type → rule when the cause chain names :data:`CONNECT_PHASE`: nothing was sent.
``pyreqwest`` raises the same types for a connection that broke or timed out after the
request went out; those fall through to :data:`TRANSPORT_ERRORS`."""

TRANSPORT_ERRORS: Final[tuple[tuple[type[BaseException], Rule], ...]] = (
    (rq.PoolTimeoutError, Rule(_T, "connect_timeout")),
    (rq.BuilderError, Rule(_T, "misconfigured")),
    (TimeoutError, Rule(_A, "timeout")),
    (rq.ConnectError, Rule(_A, "connection_lost")),
    (rq.ReadError, Rule(_A, "connection_lost")),
    (rq.WriteError, Rule(_A, "connection_lost")),
    (rq.RequestError, Rule(_A, "transport_error")),
    (Exception, Rule(_A, "client_error")),
)
"""Exception type → rule for everything else, first ``isinstance`` match wins: waiting for a
free stream slot and building the request happen before sending (TRANSIENT); a timeout or a
broken connection after that may have been processed (AMBIGUOUS)."""

EXPIRED_PROVIDER_TOKEN: Final = "ExpiredProviderToken"


def classify_response(status: int, reason: str | None) -> Rule:
    """The rule for a non-success answer: APNs reason, then HTTP status, then status class."""
    return coded_rule(reason, REASONS, status, HTTP_STATUSES, STATUS_CLASSES)


def in_connect_phase(exc: BaseException) -> bool:
    """Whether a ``pyreqwest`` error happened while connecting (its causes name
    :data:`CONNECT_PHASE`)."""
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, dict) else None
    return any(isinstance(c, dict) and c.get("message") == CONNECT_PHASE for c in causes or ())


def classify_exception(exc: BaseException) -> Rule:
    """The rule for a transport failure (:data:`CONNECT_PHASE_ERRORS`, then
    :data:`TRANSPORT_ERRORS`)."""
    if in_connect_phase(exc) and (rule := matching_row(exc, CONNECT_PHASE_ERRORS)) is not None:
        return rule
    return matching_row(exc, TRANSPORT_ERRORS) or CLIENT_ERROR


def transport_code(exc: BaseException) -> str:
    """``error_code`` of a transport failure: the exception class name, with ``:sent`` when
    ``pyreqwest`` named a connect error or timeout that happened after the connect phase."""
    name = type(exc).__name__
    connect_kind = isinstance(exc, rq.ConnectError | rq.ConnectTimeoutError)
    return f"{name}:sent" if connect_kind and not in_connect_phase(exc) else name


def reason_of(raw: bytes) -> str | None:
    """The ``reason`` of an APNs error body; None when absent or not JSON."""
    payload = parse_json(raw)
    reason = payload.get("reason") if isinstance(payload, dict) else None
    return reason if isinstance(reason, str) and reason else None
