"""Vonage SMS API adapter (the second SMS vendor), on Vonage's real wire format.

``POST {base_url}/sms/json`` with a form-encoded body: ``api_key``, ``api_secret``, ``from``,
``to`` (E.164 digits without ``+``), ``text``, ``type`` (``text`` for GSM-7, else
``unicode``), ``client-ref`` = ``{message_id}:{attempt}`` and, when ``status_callback_url`` is
set, ``callback`` + ``status-report-req=1``. Requests authenticate with the API secret; the
signature secret is only used for the signed delivery receipts (DLRs).

Vonage answers HTTP 200 for accepted *and* refused messages: ``{"message-count": "N",
"messages": [{"status": "0", "message-id", "to", "remaining-balance", "message-price",
"network", "client-ref"}, ...]}``, one entry per SMS part, and a non-``"0"`` status carries an
``error-text``. Statuses map through :data:`STATUSES` (refined for statuses 2 and 3 by the
parameter the error text names, :data:`PARAMETERS`); other HTTP answers through
:data:`HTTP_STATUSES` and :data:`STATUS_CLASSES`; transport failures through the shared
transport table. ``docs/providers.md`` explains each row.

There is no idempotency key: a timeout after the request was sent is AMBIGUOUS. Vonage echoes
``client-ref`` in every delivery receipt of the message, which is the only way to settle it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal
from urllib.parse import urlencode

import aiohttp
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import (
    HTTP_DEFAULTS,
    HttpAnswer,
    HttpProvider,
    Rule,
    is_gsm7,
    parse_retry_after,
    utcnow,
)
from notiflow.schemas.enums import Channel, Status
from notiflow.settings import Settings, VonageSettings

log = logging.getLogger(__name__)

SEND_PATH: Final = "/sms/json"
MAX_CLIENT_REF: Final = 100
"""Longest ``client-ref`` Vonage accepts."""

SignatureMethod = Literal["md5hash", "md5", "sha1", "sha256", "sha512"]
SIGNATURE_METHODS: Final[tuple[SignatureMethod, ...]] = ("md5hash", "md5", "sha1", "sha256",
                                                         "sha512")
DEFAULT_SIGNATURE_METHOD: Final[SignatureMethod] = "sha256"
"""The account's signature method this platform expects ("SHA-256 HMAC" in the dashboard)."""
SIGNATURE_MAX_SKEW_S: Final = 300

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

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
wrong base URL). 500 and 504 may come after the message was queued: AMBIGUOUS."""

STATUS_CLASSES: Final[Mapping[int, Rule]] = {
    1: Rule(_A, "unexpected_status"),
    2: Rule(_A, "malformed_response"),
    3: Rule(_T, "misconfigured"),
    4: Rule(_P, "rejected"),
    5: Rule(_T, "server_error"),
}
"""``status // 100`` → rule; the last resort. A 2xx without a usable ``messages`` list is
AMBIGUOUS."""

DLR_STATUSES: Final[Mapping[str, Status | None]] = {
    "accepted": Status.SENT,
    "buffered": Status.SENT,
    "delivered": Status.DELIVERED,
    "expired": Status.FAILED,
    "failed": Status.FAILED,
    "rejected": Status.FAILED,
    "unknown": None,
}
"""Delivery-receipt ``status`` → platform status (None: no information, ignore)."""


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
    rule = HTTP_STATUSES.get(status)
    if rule is not None:
        return rule
    return STATUS_CLASSES.get(status // 100, Rule(_A, "unexpected_status"))


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
    parts = payload["messages"]
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


def client_ref(message_id: str, attempt: int) -> str:
    """The ``client-ref`` of one attempt."""
    return f"{message_id}:{attempt}"


def parse_client_ref(ref: str | None) -> tuple[str, int] | None:
    """(message_id, attempt) of a ``client-ref`` this adapter wrote; None otherwise."""
    if not ref:
        return None
    message_id, sep, attempt = ref.rpartition(":")
    if not sep or not message_id or not attempt.isdigit():
        return None
    return message_id, int(attempt)


def e164_digits(number: str) -> str:
    """``to`` as Vonage takes it: E.164 without the leading ``+``."""
    return number[1:] if number.startswith("+") else number


# signatures --------------------------------------------------------------------------------


def signature_base(params: Mapping[str, str]) -> str:
    """The signed string: ``&name=value`` for every parameter except ``sig``, sorted by name,
    with ``&`` and ``=`` in values replaced by ``_``."""
    return "".join(f"&{name}={params[name].replace('&', '_').replace('=', '_')}"
                   for name in sorted(params) if name != "sig")


def signature(secret: str, params: Mapping[str, str],
              method: SignatureMethod = DEFAULT_SIGNATURE_METHOD) -> str:
    """Vonage's ``sig`` of ``params``: lowercase hex MD5 of the base string followed by the
    secret (``md5hash``), or uppercase hex HMAC of the base string keyed by the secret."""
    base = signature_base(params).encode()
    if method == "md5hash":
        return hashlib.md5(base + secret.encode(), usedforsecurity=False).hexdigest()
    if method not in SIGNATURE_METHODS:
        raise ValueError(f"unknown signature method {method!r}")
    return hmac.new(secret.encode(), base, method).hexdigest().upper()


def verify_signature(secret: str, params: Mapping[str, str], *,
                     method: SignatureMethod = DEFAULT_SIGNATURE_METHOD,
                     now: float | None = None, max_skew_s: float = SIGNATURE_MAX_SKEW_S) -> bool:
    """True when ``params`` carry a valid ``sig`` and a ``timestamp`` (Unix seconds) within
    ``max_skew_s`` of ``now``; the hex comparison ignores case and runs in constant time."""
    given = params.get("sig")
    stamp = params.get("timestamp", "")
    if not given or not stamp.isdigit():
        return False
    if abs(int(stamp) - (time.time() if now is None else now)) > max_skew_s:
        return False
    expected = signature(secret, params, method)
    return hmac.compare_digest(expected.lower().encode(), given.lower().encode())


# the adapter -------------------------------------------------------------------------------


class VonageSms(HttpProvider[VonageSettings]):
    """One Vonage account as a :class:`~notiflow.adapters.providers.base.ProviderClient`.

    Build it with :meth:`open` inside the event loop that will use it. ``send`` never raises
    for provider answers or transport failures; it bounds each call by the caller's timeout.
    """

    channel = Channel.SMS
    name = "vonage"
    log = log
    warn_reasons = frozenset({"auth_failed", "misconfigured", "account_inactive",
                              "quota_exceeded"})

    def __init__(self, config: VonageSettings, session: aiohttp.ClientSession, *,
                 timeout: float, connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if not config.api_key or config.api_secret is None:
            raise ValueError("vonage.api_key and vonage.api_secret are not configured")
        super().__init__(config, session, timeout=timeout, connect_timeout=connect_timeout,
                         clock=clock)
        self._url = URL(config.base_url.rstrip("/") + SEND_PATH)
        self._credentials = {"api_key": config.api_key,
                             "api_secret": config.api_secret.get_secret_value()}
        self._callback = config.status_callback_url

    @classmethod
    async def open(cls, settings: Settings | VonageSettings, *, timeout: float | timedelta,
                   connect_timeout: float | timedelta | None = None,
                   max_connections: int = 256,
                   clock: Callable[[], datetime] = utcnow) -> VonageSms:
        """Open a pooled client bound to the running loop.

        ``timeout`` bounds each ``send``; connection set-up (including waiting for a pooled
        connection) gets ``connect_timeout`` (default half of ``timeout``), so a timeout before
        anything was sent (TRANSIENT) stays distinguishable from one after (AMBIGUOUS). Raises
        ``ValueError`` when ``vonage.api_key`` / ``vonage.api_secret`` are not configured.
        """
        config = settings.vonage if isinstance(settings, Settings) else settings
        if not config.api_key or config.api_secret is None:
            raise ValueError("vonage.api_key and vonage.api_secret are not configured")
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   "Accept": "application/json", "User-Agent": "notiflow-vonage/1"}
        return await cls._open(config, headers, timeout=timeout, connect_timeout=connect_timeout,
                               max_connections=max_connections, clock=clock)

    def form(self, message: OutboundMessage) -> dict[str, str]:
        """The form fields Vonage receives for ``message`` (credentials included)."""
        text = message.body
        fields = {**self._credentials, "from": self._config.from_name,
                  "to": e164_digits(str(message.recipient)), "text": text,
                  "type": "text" if is_gsm7(text) else "unicode",
                  "client-ref": client_ref(message.message_id, message.attempt)}
        if self._callback:
            fields["callback"] = self._callback
            fields["status-report-req"] = "1"
        return fields

    def _encode(self, message: OutboundMessage) -> bytes:
        return urlencode(self.form(message)).encode()

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """A 2xx body is read part by part (:func:`read_answer`); other statuses go through
        :func:`classify_http`."""
        status = answer.status
        if 200 <= status < 300:
            return self._answer(answer.json(), message, started, status)
        rule = classify_http(status)
        wait = parse_retry_after(answer.headers.get("Retry-After")) if rule.outcome is _T else None
        return self._result(rule, message, started, error_code=f"http_{status}",
                            retry_after_s=wait)

    def _answer(self, payload: Any, message: OutboundMessage, started: datetime,
                http_status: int) -> SendResult:
        answer = read_answer(payload)
        if answer.message_id is not None:
            if answer.accepted_parts < answer.parts:
                log.warning("vonage accepted %d of %d parts of %s attempt %d (status %s)",
                            answer.accepted_parts, answer.parts, message.message_id,
                            message.attempt, answer.status)
            return self._accepted(started, answer.message_id)
        assert answer.rule is not None
        return self._result(answer.rule, message, started,
                            error_code=answer.status or f"http_{http_status}",
                            retry_after_s=answer.retry_after_s)

    def _account_label(self) -> str:
        return f"account {self._config.api_key}"
