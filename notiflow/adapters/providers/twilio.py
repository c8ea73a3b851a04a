"""Twilio Programmable Messaging (SMS) adapter, on Twilio's real wire format.

``POST {base_url}/2010-04-01/Accounts/{AccountSid}/Messages.json`` with a form-encoded body
(``To``, ``From``, ``Body``, optional ``StatusCallback``) and HTTP Basic auth
``AccountSid:AuthToken``. A 201 with a Message resource (``sid``) is the provider's acceptance.

Every other answer, and every transport failure, is mapped to an :class:`Outcome` through the
data tables below (:data:`ERROR_CODES`, :data:`HTTP_STATUSES`, :data:`STATUS_CLASSES`, and
the transport table in ``common``); ``docs/providers.md`` explains each row. Twilio has no
idempotency key for message creation, so a timeout after the request was sent is AMBIGUOUS and
cannot be resolved by retrying with a key; the ``message_id``/``attempt`` carried in the
StatusCallback query lets a later status callback settle it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import (
    HTTP_DEFAULTS,
    HttpAnswer,
    HttpProvider,
    Rule,
    parse_retry_after,
    utcnow,
)
from notiflow.adapters.providers.common import classify_exception as classify_exception
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings, TwilioSettings
from notiflow.telemetry import current_traceparent

log = logging.getLogger(__name__)

API_VERSION: Final = "2010-04-01"


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
"""HTTP status → rule, for answers whose error code is absent or not in :data:`ERROR_CODES`."""

STATUS_CLASSES: Final[Mapping[int, Rule]] = {
    1: Rule(_A, "unexpected_status"),
    2: Rule(_A, "malformed_response"),
    3: Rule(_T, "misconfigured"),
    4: Rule(_P, "rejected"),
    5: Rule(_T, "server_error"),
}
"""``status // 100`` → rule; the last resort for a non-success answer."""

def classify_response(status: int, code: int | None) -> Rule:
    """The rule for a non-success answer: error code, then HTTP status, then status class."""
    if code is not None and (rule := ERROR_CODES.get(code)) is not None:
        return rule
    rule = HTTP_STATUSES.get(status)
    if rule is not None:
        return rule
    return STATUS_CLASSES.get(status // 100, Rule(_A, "unexpected_status"))


def error_code_of(payload: Any) -> int | None:
    """The integer ``code`` of a Twilio error body, if any."""
    if isinstance(payload, dict):
        code = payload.get("code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
        if isinstance(code, str) and code.isdigit():
            return int(code)
    return None


def signature(auth_token: str, url: str, params: Mapping[str, str]) -> str:
    """``X-Twilio-Signature`` of a webhook: base64(HMAC-SHA1(auth token, full URL followed by
    every POST parameter name and value, sorted by name, without separators))."""
    payload = url + "".join(name + params[name] for name in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def verify_signature(auth_token: str, url: str, params: Mapping[str, str],
                     header: str | None) -> bool:
    """True when ``header`` is the signature Twilio computes for this request (constant time)."""
    if not header:
        return False
    return hmac.compare_digest(signature(auth_token, url, params), header)


def status_callback(base: str, message_id: str, attempt: int,
                    traceparent: str | None = None) -> str:
    """The StatusCallback URL of one attempt: ``base`` plus ``message_id`` and ``attempt``,
    and the ``traceparent`` of the provider call when there is one (Twilio signs the whole
    URL, so the receipt joins the message's trace; ``docs/observability.md``)."""
    sep = "&" if "?" in base else "?"
    query: dict[str, str | int] = {"message_id": message_id, "attempt": attempt}
    if traceparent:
        query["traceparent"] = traceparent
    return f"{base}{sep}{urlencode(query)}"


class TwilioSms(HttpProvider[TwilioSettings]):
    """One Twilio account as a :class:`~notiflow.adapters.providers.base.ProviderClient`.

    Build it with :meth:`open` inside the event loop that will use it. ``send`` never raises
    for provider answers or transport failures; it bounds each call by the caller's timeout.
    """

    channel = Channel.SMS
    name = "twilio"
    log = log
    warn_reasons = frozenset({"auth_failed", "misconfigured", "account_inactive"})

    def __init__(self, config: TwilioSettings, session: aiohttp.ClientSession, *,
                 timeout: float, connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if config.auth_token is None:
            raise ValueError("twilio.auth_token is not configured")
        super().__init__(config, session, timeout=timeout, connect_timeout=connect_timeout,
                         clock=clock)
        self._url = URL(f"{config.base_url.rstrip('/')}/{API_VERSION}/Accounts/"
                        f"{config.account_sid}/Messages.json")
        self._callback = config.status_callback_url

    @classmethod
    async def open(cls, settings: Settings | TwilioSettings, *, timeout: float | timedelta,
                   connect_timeout: float | timedelta | None = None,
                   max_connections: int = 256,
                   clock: Callable[[], datetime] = utcnow) -> TwilioSms:
        """Open a pooled client bound to the running loop.

        ``timeout`` bounds each ``send`` (the tier's ``provider_timeout``); connection set-up,
        including a wait for a free pooled connection, gets ``connect_timeout`` (default half of
        ``timeout``) so that a timeout before anything was sent stays distinguishable
        (TRANSIENT) from one after (AMBIGUOUS).
        """
        config = settings.twilio if isinstance(settings, Settings) else settings
        if config.auth_token is None:
            raise ValueError("twilio.auth_token is not configured")
        token = config.auth_token.get_secret_value()
        credentials = base64.b64encode(f"{config.account_sid}:{token}".encode()).decode()
        headers = {"Authorization": f"Basic {credentials}",
                   "Content-Type": "application/x-www-form-urlencoded",
                   "Accept": "application/json", "User-Agent": "notiflow-twilio/1"}
        return await cls._open(config, headers, timeout=timeout, connect_timeout=connect_timeout,
                               max_connections=max_connections, clock=clock)

    def form(self, message: OutboundMessage) -> dict[str, str]:
        """The form fields Twilio receives for ``message``."""
        fields = {"To": str(message.recipient), "From": self._config.from_number,
                  "Body": message.body}
        if self._callback:
            fields["StatusCallback"] = status_callback(self._callback, message.message_id,
                                                       message.attempt, current_traceparent())
        return fields

    def _encode(self, message: OutboundMessage) -> bytes:
        return urlencode(self.form(message)).encode()

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """A 2xx with a Message ``sid`` is accepted; anything else goes through the tables."""
        status, payload = answer.status, answer.json()
        if 200 <= status < 300:
            sid = payload.get("sid") if isinstance(payload, dict) else None
            if isinstance(sid, str) and sid:
                return self._accepted(started, sid)
            return self._result(STATUS_CLASSES[2], message, started, error_code=f"http_{status}")
        code = error_code_of(payload)
        rule = classify_response(status, code)
        wait = (parse_retry_after(answer.headers.get("Retry-After"))
                if rule.outcome is Outcome.TRANSIENT else None)
        return self._result(rule, message, started,
                            error_code=str(code) if code is not None else f"http_{status}",
                            retry_after_s=wait)

    def _account_label(self) -> str:
        return f"account {self._config.account_sid}"
