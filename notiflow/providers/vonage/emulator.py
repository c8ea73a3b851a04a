"""Vonage SMS API emulator (``notiflow fakes``; dev, tests, benchmarks).

Serves ``/vonage/sms/json`` (POST form or JSON body, or GET query) on Vonage's wire format:
``api_key`` + ``api_secret`` checked against the configured account, or a signed request
(``sig`` + ``timestamp`` with the signature secret, :mod:`notiflow.providers.vonage`
signing); every answer to an authenticated-or-not request is HTTP 200 with ``{"message-count",
"messages": [...]}``, one entry per SMS part, and a refused message carries ``status`` +
``error-text`` as Vonage's do. Accepted messages get delivery receipts (DLRs) at the message's
``callback`` (or the ``dlr_url`` knob), one per part, as GET query, form POST or JSON POST
(knob ``dlr_method``), signed with ``sig`` when ``vonage.signature_secret`` is configured.
Latency, outages (HTTP 503 from the edge), 5xx, throttling (status 1 with Vonage's
``please wait [ ms ]`` text) and accepted-then-hang are knobs over ``/_admin/vonage/config``.
Every request is recorded (the newest ``max_records``) with the ``message_id`` / ``attempt``
parsed from ``client-ref``, recipient included: test infrastructure only.

Magic recipients (emulator only): ``447700900NNN`` (the UK drama range) answers Vonage status
``NNN`` for every documented status (e.g. ``447700900006`` → 6 Invalid Message,
``447700900033`` → 33 Number De-activated); ``447700900000`` is accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit

import aiohttp
import orjson
from aiohttp import web
from pydantic import Field

from notiflow.adapters.providers.sms import sms_segments
from notiflow.fakes.common import (
    ACCEPTED,
    CommonKnobs,
    Emulator,
    MessageRecord,
    WebhookDispatcher,
    json_response,
)
from notiflow.providers.vonage.client import SEND_PATH
from notiflow.providers.vonage.receipts import MAX_CLIENT_REF, parse_client_ref
from notiflow.providers.vonage.signature import (
    SignatureMethod,
    signature,
    verify_signature,
)
from notiflow.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "/vonage"
MAGIC_PREFIX: Final = "447700900"

STATUS_TEXTS: Final[Mapping[str, str]] = {
    "1": "Throughput Rate Exceeded - please wait [ {wait_ms} ] and retry",
    "2": "Missing Parameters",
    "3": "Invalid Parameters",
    "4": "Bad Credentials",
    "5": "Internal Error",
    "6": "Invalid Message",
    "7": "Number Barred",
    "8": "Partner Account Barred",
    "9": "Partner Quota Exceeded",
    "10": "Too Many Existing Binds",
    "11": "Account Not Enabled For HTTP",
    "12": "Message Too Long",
    "13": "Communication Failed",
    "14": "Invalid Signature",
    "15": "Illegal Sender Address - rejected",
    "16": "Invalid TTL",
    "19": "Facility Not Allowed",
    "20": "Invalid Message Class",
    "22": "Invalid Network Code",
    "23": "Invalid Callback Url",
    "29": "Non White-listed Destination - rejected",
    "32": "Signature And API Secret Disallowed",
    "33": "Number De-activated",
    "34": "Invalid or Missing Msisdn Param",
    "101": "Destination opted out of the program",
}
"""Vonage SMS API status → ``error-text`` the emulator answers with."""

DLR_ERRORS: Final[Mapping[str, str]] = {"delivered": "0", "failed": "1"}
"""DLR ``status`` → ``err-code`` (0 Delivered, 1 Unknown)."""

_TO = re.compile(r"[1-9][0-9]{6,14}")
_NUMERIC_FROM = re.compile(r"\+?[0-9]{1,15}")
_ALPHA_FROM = re.compile(r"[A-Za-z0-9 ]{1,11}")
_PRICE = 0.0333


class VonageKnobs(CommonKnobs):
    """Runtime behaviour of the Vonage emulator. ``error_rate_429`` answers status 1
    (Throttled) in an HTTP 200, with ``retry_after_s`` as the ``please wait [ ms ]`` of its
    error text; ``error_rate_5xx`` / ``outage`` are HTTP errors of Vonage's edge."""

    callbacks_enabled: bool = True
    callback_delay_ms: float = Field(50.0, ge=0)
    """Delay before each part's delivery receipt."""
    undelivered_rate: float = Field(0.0, ge=0, le=1)
    """Share of accepted messages whose receipts say ``failed`` (err-code 1)."""
    dlr_method: Literal["GET", "POST", "POST-JSON"] = "POST"
    """How receipts are sent (the account's webhook method in Vonage's dashboard)."""
    dlr_url: str | None = None
    """Receipts for messages without ``callback`` go here (the account's default URL)."""
    signature_method: SignatureMethod = "sha256"
    """The account's signature method: checks signed requests, signs receipts."""


@dataclass(slots=True)
class VonageRecord(MessageRecord):
    """One request; ``sid`` is the first part's ``message-id``, ``error_code`` the Vonage
    status of a refused message."""

    client_ref: str | None = None
    parts: int = 0
    type: str | None = None
    error: str | None = None
    """The ``error-text`` of a refused message."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """One delivery receipt to send."""

    params: dict[str, str]
    method: Literal["GET", "POST", "POST-JSON"]


async def _deliver(session: aiohttp.ClientSession, url: str, receipt: Receipt) -> int:
    if receipt.method == "GET":
        sep = "&" if urlsplit(url).query else "?"
        async with session.get(f"{url}{sep}{urlencode(receipt.params)}") as resp:
            await resp.read()
            return resp.status
    if receipt.method == "POST":
        async with session.post(url, data=urlencode(receipt.params), headers={
                "Content-Type": "application/x-www-form-urlencoded"}) as resp:
            await resp.read()
            return resp.status
    async with session.post(url, data=orjson.dumps(receipt.params),
                            headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        return resp.status


def _answer(*messages: Mapping[str, str]) -> web.Response:
    return json_response(orjson.dumps({"message-count": str(len(messages)),
                                       "messages": list(messages)}), 200)


def _edge_error(status: int) -> web.Response:
    reason = "Service Unavailable" if status == 503 else "Internal Server Error"
    return web.Response(status=status, content_type="text/html",
                        text=f"<html><body><h1>{status} {reason}</h1></body></html>")


class VonageEmulator(Emulator[VonageKnobs]):
    """State and handlers of the Vonage emulator (one configured account)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("vonage", VonageKnobs)
        config = settings.vonage
        self.api_key = config.api_key
        self._api_secret = config.api_secret.get_secret_value() if config.api_secret else None
        self._signature_secret = (config.signature_secret.get_secret_value()
                                  if config.signature_secret else None)
        self.receipts: WebhookDispatcher[Receipt] = WebhookDispatcher(
            "vonage", _deliver, user_agent="Vonage-DLR/1.0")
        self._balance = 100.0
        if not self.api_key or self._api_secret is None:
            log.warning("vonage emulator: no api key/secret configured "
                        "(NOTIFLOW_VONAGE__API_KEY, NOTIFLOW_VONAGE__API_SECRET); every request "
                        "will get status 4")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(PREFIX + SEND_PATH, self.send_sms),
            web.get(PREFIX + SEND_PATH, self.send_sms),
            *self.admin_routes(),
        ]

    async def lifecycle(self, _app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx`` hook: runs the receipt dispatcher while the app runs."""
        await self.receipts.start()
        yield
        await self.receipts.stop()

    def reset(self) -> None:
        super().reset()
        self.receipts.clear()
        self._balance = 100.0

    def extra_stats(self) -> dict[str, Any]:
        return {"callbacks": self.receipts.stats()}

    async def _params(self, request: web.Request) -> dict[str, str]:
        params = dict(request.query)
        raw = await request.read()
        if not raw:
            return params
        if request.content_type == "application/json":
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError:
                return params
            if isinstance(body, dict):
                params.update({k: str(v) for k, v in body.items() if v is not None})
            return params
        with contextlib.suppress(UnicodeDecodeError):
            params.update(parse_qsl(raw.decode(), keep_blank_values=True))
        return params

    def _authenticate(self, params: Mapping[str, str]) -> str | None:
        """None when authenticated, else the refusing Vonage status."""
        if not params.get("api_key"):
            return "2"
        if self.api_key is None or not hmac.compare_digest(params["api_key"].encode(),
                                                           self.api_key.encode()):
            return "4"
        if "sig" in params:
            if "api_secret" in params:
                return "32"
            if self._signature_secret is None or not verify_signature(
                    self._signature_secret, params, method=self.knobs.signature_method):
                return "14"
            return None
        secret = params.get("api_secret")
        if not secret:
            return "2"
        if self._api_secret is None or not hmac.compare_digest(secret.encode(),
                                                               self._api_secret.encode()):
            return "4"
        return None

    async def send_sms(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        params = await self._params(request)
        to, from_, text = params.get("to"), params.get("from"), params.get("text")
        ref = params.get("client-ref")
        correlation = parse_client_ref(ref)
        kind = params.get("type", "text")

        def record(outcome: str, status: int, code: str | None = None, *,
                   sid: str | None = None, parts: int = 0, hang: bool = False,
                   error: str | None = None) -> None:
            self.messages.add(VonageRecord(
                received_at, outcome, status, int(code) if code else None, sid,
                correlation[0] if correlation else None,
                correlation[1] if correlation else None, to, from_, text, hang,
                client_ref=ref, parts=parts, type=kind, error=error))

        def refuse(outcome: str, code: str, error: str | None = None) -> web.Response:
            error = error or STATUS_TEXTS[code].format(
                wait_ms=int(knobs.retry_after_s * 1000))
            record(outcome, 200, code, error=error)
            entry = {"status": code, "error-text": error}
            if to and code not in ("2", "4", "14", "32"):
                entry = {"to": to, **entry}
            return _answer(entry)

        await self.added_latency(knobs)
        if knobs.outage:
            record("outage", 503)
            return _edge_error(503)
        refused = self._authenticate(params)
        if refused is not None:
            missing = "Missing api_key" if not params.get("api_key") else "Missing api_secret"
            return refuse("unauthorized", refused, missing if refused == "2" else None)
        if self.draw(knobs.error_rate_429):
            return refuse("rate_limited", "1")
        if self.draw(knobs.error_rate_5xx):
            status = self.rng.choice(knobs.statuses_5xx)
            record("server_error", status)
            return _edge_error(status)
        invalid = self._validate(params)
        if invalid is not None:
            return refuse("invalid", *invalid)
        assert to is not None and from_ is not None and text is not None
        magic = to[len(MAGIC_PREFIX):].lstrip("0") if to.startswith(MAGIC_PREFIX) else ""
        if len(to) == len(MAGIC_PREFIX) + 3 and magic in STATUS_TEXTS:
            return refuse("invalid", magic)
        parts = sms_segments(text, ucs2=kind == "unicode")
        ids = [str(uuid.uuid4()) for _ in range(parts)]
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200, sid=ids[0], parts=parts, hang=hang)
        network = "23410" if to.startswith("44") else "310260"
        entries = []
        for message_id in ids:
            self._balance = max(self._balance - _PRICE, 0.0)
            entry = {"to": to, "message-id": message_id, "status": "0",
                     "remaining-balance": f"{self._balance:.8f}",
                     "message-price": f"{_PRICE:.8f}", "network": network}
            if ref is not None:
                entry["client-ref"] = ref
            entries.append(entry)
        url = params.get("callback") or knobs.dlr_url
        if url and knobs.callbacks_enabled:
            self._schedule_receipts(knobs, url, ids, to, from_, ref, network)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return _answer(*entries)

    @staticmethod
    def _validate(params: Mapping[str, str]) -> tuple[str, str] | None:
        """(status, error-text) for a malformed request; None when valid."""
        for name in ("from", "to"):
            if not params.get(name):
                return "2", f"Missing {name} param"
        kind = params.get("type", "text")
        if kind not in ("text", "unicode"):
            return "3", "Invalid type param"
        if not params.get("text"):
            return "2", "Missing text param"
        sender = params["from"]
        if not (_NUMERIC_FROM.fullmatch(sender) or _ALPHA_FROM.fullmatch(sender)):
            return "3", "Invalid from param"
        if not _TO.fullmatch(params["to"]):
            return "3", "Invalid to param"
        if len(params.get("client-ref", "")) > MAX_CLIENT_REF:
            return "3", "Invalid client-ref param"
        callback = params.get("callback")
        if callback is not None:
            parts = urlsplit(callback)
            if parts.scheme not in ("http", "https") or not parts.netloc or len(callback) > 255:
                return "23", STATUS_TEXTS["23"]
        return None

    def _schedule_receipts(self, knobs: VonageKnobs, url: str, ids: list[str], to: str,
                           from_: str, ref: str | None, network: str) -> None:
        status = "failed" if self.draw(knobs.undelivered_rate) else "delivered"
        now = datetime.now(UTC)
        due = time.monotonic() + knobs.callback_delay_ms / 1000
        for message_id in ids:
            params = {"msisdn": to, "to": from_, "network-code": network,
                      "messageId": message_id, "price": f"{_PRICE:.8f}", "status": status,
                      "scts": now.strftime("%y%m%d%H%M"), "err-code": DLR_ERRORS[status],
                      "api-key": self.api_key or "",
                      "message-timestamp": now.strftime("%Y-%m-%d %H:%M:%S")}
            if ref is not None:
                params["client-ref"] = ref
            if self._signature_secret is not None:
                params["timestamp"] = str(int(time.time()))
                params["nonce"] = secrets.token_hex(8)
                params["sig"] = signature(self._signature_secret, params,
                                          knobs.signature_method)
            self.receipts.schedule(due, url, Receipt(params, knobs.dlr_method))

