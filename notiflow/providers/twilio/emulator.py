"""Twilio Programmable Messaging emulator (``notiflow fakes``; dev, tests, benchmarks).

Serves ``POST /twilio/2010-04-01/Accounts/{AccountSid}/Messages.json`` on Twilio's wire format:
HTTP Basic auth checked against the configured account, form fields ``To``/``From``/``Body``/
``StatusCallback``, Twilio's test "magic numbers", Twilio's error bodies, a realistic Message
resource on success, and signed asynchronous status callbacks (``sent`` then ``delivered`` or
``undelivered``). Latency, error mix, outages, 429 + Retry-After and accepted-then-hang are
knobs that can be changed at runtime over ``/_admin/twilio/config``. Every request to the
Messages endpoint is recorded (the newest ``max_records``), recipient included: this is test
infrastructure, never a production component.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import os
import random
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Final
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import aiohttp
import orjson
from aiohttp import web
from pydantic import Field

from notiflow.adapters.providers.sms import sms_segments as segments
from notiflow.fakes.common import (
    ACCEPTED,
    CommonKnobs,
    Deliver,
    Emulator,
    MessageRecord,
    WebhookDispatcher,
    json_response,
    retry_after_text,
)
from notiflow.fakes.common import MessageLog as MessageLog
from notiflow.providers.twilio.client import API_VERSION
from notiflow.providers.twilio.signature import signature
from notiflow.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "/twilio"
_E164 = re.compile(r"\+[1-9][0-9]{1,14}")

MAGIC_TO: Final[Mapping[str, tuple[int, str]]] = {
    "+15005550001": (21211, "Invalid 'To' Phone Number: {to}"),
    "+15005550002": (21612, "The 'To' phone number: {to}, is not currently reachable using the "
                            "'From' phone number: {from_} via SMS."),
    "+15005550003": (21408, "Permission to send an SMS has not been enabled for the region "
                            "indicated by the 'To' number: {to}."),
    "+15005550004": (21610, "Attempt to send to unsubscribed recipient"),
    "+15005550009": (21614, "'To' number {to} is not a valid mobile number"),
}
"""Twilio's documented test ``To`` numbers and the error each one returns (HTTP 400)."""

MAGIC_FROM: Final[Mapping[str, tuple[int, str]]] = {
    "+15005550001": (21212, "The 'From' number {from_} is not a valid phone number, shortcode, "
                            "or alphanumeric sender ID."),
    "+15005550007": (21606, "The 'From' phone number provided is not a valid, message-capable "
                            "Twilio phone number."),
    "+15005550008": (21611, "This 'From' number has exceeded the maximum number of queued "
                            "messages"),
}
"""Twilio's documented test ``From`` numbers and the error each one returns (HTTP 400)."""

MAX_BODY_CHARS: Final = 1600

def error_body(code: int, message: str, status: int) -> bytes:
    """Twilio's JSON error body."""
    return orjson.dumps({"code": code, "message": message,
                         "more_info": f"https://www.twilio.com/docs/errors/{code}",
                         "status": status})


class TwilioKnobs(CommonKnobs):
    """Runtime behaviour of the Twilio emulator: the common knobs (5xx are 500 with code 20500
    and 503 with 20503, 429 is 20429, an outage is 503 20503) plus the status callbacks."""

    callbacks_enabled: bool = True
    callback_delay_ms: float = Field(50.0, ge=0)
    """Delay before the ``sent`` callback; the final callback follows after the same delay."""
    undelivered_rate: float = Field(0.0, ge=0, le=1)
    """Share of accepted messages whose final callback is ``undelivered`` (ErrorCode 30003)."""


def signed_callbacks(auth_token: str) -> Deliver[dict[str, str]]:
    """Posts one status callback, form-encoded and signed with ``X-Twilio-Signature``."""

    async def deliver(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> int:
        headers = {"X-Twilio-Signature": signature(auth_token, url, params),
                   "Content-Type": "application/x-www-form-urlencoded"}
        async with session.post(url, data=urlencode(params), headers=headers) as resp:
            await resp.read()
            return resp.status

    return deliver


class _Clock:
    """Wall-clock seconds and the RFC 2822 date Twilio uses, cached per second."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def rfc2822(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._text = format_datetime(datetime.fromtimestamp(second, UTC))
        return self._text


class TwilioEmulator(Emulator[TwilioKnobs]):
    """State and handlers of the Twilio emulator (one configured account)."""

    callbacks: WebhookDispatcher[dict[str, str]]

    def __init__(self, settings: Settings, *, rng: random.Random | None = None) -> None:
        config = settings.twilio
        token = config.auth_token.get_secret_value() if config.auth_token else None
        super().__init__("twilio", TwilioKnobs, rng=rng, callbacks=WebhookDispatcher(
            "twilio", signed_callbacks(token or ""), user_agent="TwilioProxy/1.1"))
        self.account_sid = config.account_sid
        self._expected_auth = (
            "Basic " + base64.b64encode(f"{config.account_sid}:{token}".encode()).decode()
            if token else None)
        self._clock = _Clock()
        self._unauthorized = error_body(20003, "Authenticate", 401)
        self._too_many = error_body(20429, "Too Many Requests", 429)
        self._internal = error_body(20500, "Internal Server Error", 500)
        self._unavailable = error_body(20503, "Service Unavailable", 503)
        if token is None:
            log.warning("twilio emulator: no auth token configured "
                        "(NOTIFLOW_TWILIO__AUTH_TOKEN); every request will get 401")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"{PREFIX}/{API_VERSION}/Accounts/{{account_sid}}/Messages.json",
                     self.create_message),
            *self.admin_routes(),
        ]

    # Messages endpoint -----------------------------------------------------------------

    async def create_message(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        try:
            form = dict(parse_qsl((await request.read()).decode(), keep_blank_values=True))
        except UnicodeDecodeError:
            form = {}
        to, from_, body = form.get("To"), form.get("From"), form.get("Body")
        callback = form.get("StatusCallback") or None
        message_id, attempt = _correlation(callback)

        def record(outcome: str, status: int, code: int | None = None,
                   sid: str | None = None, hang: bool = False) -> None:
            self.messages.add(MessageRecord(received_at, outcome, status, code, sid, message_id,
                                       attempt, to, from_, body, hang))

        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503, 20503)
            return json_response(self._unavailable, 503)
        auth = request.headers.get("Authorization")
        if (self._expected_auth is None or auth is None
                or not _same(auth, self._expected_auth)):
            record("unauthorized", 401, 20003)
            return json_response(self._unauthorized, 401,
                                 {"WWW-Authenticate": 'Basic realm="Twilio API"'})
        path_sid = request.match_info["account_sid"]
        if path_sid != self.account_sid:
            record("invalid", 404, 20404)
            return json_response(error_body(20404, f"The requested resource {request.path} was "
                                            "not found", 404), 404)
        if self.draw(knobs.error_rate_429):
            record("rate_limited", 429, 20429)
            return json_response(self._too_many, 429,
                                 {"Retry-After": retry_after_text(knobs.retry_after_s)})
        if self.draw(knobs.error_rate_5xx):
            if self.rng.choice(knobs.statuses_5xx) == 500:
                record("server_error", 500, 20500)
                return json_response(self._internal, 500)
            record("server_error", 503, 20503)
            return json_response(self._unavailable, 503)
        invalid = _validate(to, from_, body)
        if invalid is not None:
            code, message = invalid
            record("invalid", 400, code)
            return json_response(error_body(code, message, 400), 400)
        assert to is not None and from_ is not None and body is not None
        sid = "SM" + os.urandom(16).hex()
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 201, sid=sid, hang=hang)
        if callback is not None and knobs.callbacks_enabled:
            self._schedule_callbacks(knobs, callback, sid, to, from_)
        date = self._clock.rfc2822(received_at)
        uri = f"/{API_VERSION}/Accounts/{self.account_sid}/Messages/{sid}"
        resource = orjson.dumps({
            "account_sid": self.account_sid, "api_version": API_VERSION, "body": body,
            "date_created": date, "date_sent": None, "date_updated": date,
            "direction": "outbound-api", "error_code": None, "error_message": None,
            "from": from_, "messaging_service_sid": None, "num_media": "0",
            "num_segments": str(segments(body)), "price": None, "price_unit": "USD",
            "sid": sid, "status": "queued",
            "subresource_uris": {"media": f"{uri}/Media.json"}, "to": to,
            "uri": f"{uri}.json",
        })
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return json_response(resource, 201)

    def _schedule_callbacks(self, knobs: TwilioKnobs, url: str, sid: str, to: str,
                            from_: str) -> None:
        delay = knobs.callback_delay_ms / 1000
        now = time.monotonic()
        common = {"AccountSid": self.account_sid, "ApiVersion": API_VERSION, "From": from_,
                  "MessageSid": sid, "SmsSid": sid, "To": to}
        self.callbacks.schedule(now + delay, url,
                                {**common, "MessageStatus": "sent", "SmsStatus": "sent"})
        if self.draw(knobs.undelivered_rate):
            final = {**common, "MessageStatus": "undelivered", "SmsStatus": "undelivered",
                     "ErrorCode": "30003"}
        else:
            final = {**common, "MessageStatus": "delivered", "SmsStatus": "delivered"}
        self.callbacks.schedule(now + 2 * delay, url, final)


def _validate(to: str | None, from_: str | None, body: str | None) -> tuple[int, str] | None:
    if not to:
        return 21604, "A 'To' phone number is required."
    if not from_:
        return 21603, "A 'From' phone number is required."
    if not body:
        return 21602, "Message body is required."
    if len(body) > MAX_BODY_CHARS:
        return 21617, "The concatenated message body exceeds the 1600 character limit."
    magic = MAGIC_FROM.get(from_)
    if magic is not None:
        return magic[0], magic[1].format(to=to, from_=from_)
    if not _E164.fullmatch(to):
        return 21211, f"Invalid 'To' Phone Number: {to}"
    magic = MAGIC_TO.get(to)
    if magic is not None:
        return magic[0], magic[1].format(to=to, from_=from_)
    return None


def _correlation(callback: str | None) -> tuple[str | None, int | None]:
    if not callback:
        return None, None
    query = parse_qs(urlsplit(callback).query)
    message_id = query.get("message_id", [None])[0]
    attempt = query.get("attempt", [None])[0]
    try:
        return message_id, int(attempt) if attempt is not None else None
    except ValueError:
        return message_id, None


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())
