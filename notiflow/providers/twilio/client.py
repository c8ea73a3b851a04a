"""Twilio Programmable Messaging (SMS) adapter, on Twilio's real wire format.

``POST {base_url}/2010-04-01/Accounts/{AccountSid}/Messages.json`` with a form-encoded body
(``To``, ``From``, ``Body``, optional ``StatusCallback``) and HTTP Basic auth
``AccountSid:AuthToken``. A 201 with a Message resource (``sid``) is the provider's acceptance.

Every other answer, and every transport failure, is mapped to an :class:`Outcome` through the
tables of :mod:`~notiflow.providers.twilio.classify` and the transport table in
``common``; ``docs/providers.md`` explains each row. Twilio has no idempotency key for message
creation, so a timeout after the request was sent is AMBIGUOUS and cannot be resolved by
retrying with a key; the ``message_id``/``attempt`` carried in the StatusCallback query lets a
later status callback settle it.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Final
from urllib.parse import urlencode

import aiohttp
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, SendResult
from notiflow.adapters.providers.common import HttpAnswer, HttpProvider, retry_wait, utcnow
from notiflow.providers.twilio.classify import (
    STATUS_CLASSES,
    classify_response,
    error_code_of,
)
from notiflow.providers.twilio.config import TwilioSettings
from notiflow.schemas.enums import Channel
from notiflow.telemetry import current_traceparent

log = logging.getLogger(__name__)

API_VERSION: Final = "2010-04-01"


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
    """One Twilio account as a :class:`~notiflow.adapters.providers.base.ProviderClient`
    (opened and bounded as :class:`~notiflow.adapters.providers.common.HttpProvider` says)."""

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
    def _headers(cls, config: TwilioSettings) -> dict[str, str]:
        """HTTP Basic ``AccountSid:AuthToken`` and the form content type."""
        if config.auth_token is None:
            raise ValueError("twilio.auth_token is not configured")
        token = config.auth_token.get_secret_value()
        credentials = base64.b64encode(f"{config.account_sid}:{token}".encode()).decode()
        return {"Authorization": f"Basic {credentials}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json", "User-Agent": "notiflow-twilio/1"}

    def form(self, message: OutboundMessage) -> dict[str, str]:
        """The form fields Twilio receives for ``message``."""
        fields = {"To": str(message.recipient),
                  "From": message.sender or self._config.from_number,
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
        return self._result(rule, message, started,
                            error_code=str(code) if code is not None else f"http_{status}",
                            retry_after_s=retry_wait(rule, answer.headers.get("Retry-After")))

    def _account_label(self) -> str:
        return f"account {self._config.account_sid}"
