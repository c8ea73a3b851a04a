"""Vonage SMS API adapter (the second SMS vendor), on Vonage's real wire format.

``POST {base_url}/sms/json`` with a form-encoded body: ``api_key``, ``api_secret``, ``from``,
``to`` (E.164 digits without ``+``), ``text``, ``type`` (``text`` for GSM-7, else
``unicode``), ``client-ref`` = ``{message_id}:{attempt}`` and, when ``status_callback_url`` is
set, ``callback`` + ``status-report-req=1``. Requests authenticate with the API secret; the
signature secret is only used for the signed delivery receipts (DLRs, ``signature``).

Vonage answers HTTP 200 for accepted *and* refused messages: ``{"message-count": "N",
"messages": [{"status": "0", "message-id", "to", "remaining-balance", "message-price",
"network", "client-ref"}, ...]}``, one entry per SMS part, and a non-``"0"`` status carries an
``error-text``. Such a body is read by :func:`~.classify.read_answer`; other HTTP answers go
through :func:`~.classify.classify_http`, transport failures through the shared transport
table. ``docs/providers.md`` explains each row.

There is no idempotency key: a timeout after the request was sent is AMBIGUOUS. Vonage echoes
``client-ref`` in every delivery receipt of the message, which is the only way to settle it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, SendResult
from notiflow.adapters.providers.common import HttpAnswer, HttpProvider, retry_wait, utcnow
from notiflow.adapters.providers.sms import is_gsm7
from notiflow.providers.vonage.classify import classify_http, read_answer
from notiflow.providers.vonage.config import VonageSettings
from notiflow.providers.vonage.receipts import client_ref
from notiflow.schemas.enums import Channel

log = logging.getLogger(__name__)

SEND_PATH: Final = "/sms/json"


def e164_digits(number: str) -> str:
    """``to`` as Vonage takes it: E.164 without the leading ``+``."""
    return number[1:] if number.startswith("+") else number


class VonageSms(HttpProvider[VonageSettings]):
    """One Vonage account as a :class:`~notiflow.adapters.providers.base.ProviderClient`
    (opened and bounded as :class:`~notiflow.adapters.providers.common.HttpProvider` says)."""

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
    def _headers(cls, config: VonageSettings) -> dict[str, str]:
        """The form content type (the credentials travel in the form); ``ValueError`` when
        ``vonage.api_key`` / ``vonage.api_secret`` are not configured."""
        if not config.api_key or config.api_secret is None:
            raise ValueError("vonage.api_key and vonage.api_secret are not configured")
        return {"Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json", "User-Agent": "notiflow-vonage/1"}

    def form(self, message: OutboundMessage) -> dict[str, str]:
        """The form fields Vonage receives for ``message`` (credentials included)."""
        text = message.body
        fields = {**self._credentials, "from": self._sender(message),
                  "to": e164_digits(str(message.recipient)), "text": text,
                  "type": "text" if is_gsm7(text) else "unicode",
                  "client-ref": client_ref(message.message_id, message.attempt)}
        if self._callback:
            fields["callback"] = self._callback
            fields["status-report-req"] = "1"
        return fields

    def _sender(self, message: OutboundMessage) -> str:
        """The message's sender (a number without its ``+``, as Vonage takes it), else the
        account's ``from_name`` (empty when unset: Vonage refuses the request)."""
        sender = message.sender
        if sender is None:
            return self._config.from_name or ""
        return e164_digits(sender) if sender.startswith("+") else sender

    def _encode(self, message: OutboundMessage) -> bytes:
        return urlencode(self.form(message)).encode()

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """A 2xx body is read part by part (:func:`~.classify.read_answer`); other statuses go
        through :func:`~.classify.classify_http`."""
        status = answer.status
        if 200 <= status < 300:
            return self._answer(answer.json(), message, started, status)
        rule = classify_http(status)
        return self._result(rule, message, started, error_code=f"http_{status}",
                            retry_after_s=retry_wait(rule, answer.headers.get("Retry-After")))

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
