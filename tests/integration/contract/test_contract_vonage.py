"""Vonage SMS API: its harness, the wire format, signed delivery receipts (GET, form POST and JSON
POST, verified by an independent implementation of Vonage's documented signature), its
documented status codes and signed requests."""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar
from urllib.parse import parse_qsl

import httpx
import orjson
import pytest
from aiohttp import web

from notiflow.adapters.providers.base import Outcome
from notiflow.providers.vonage.client import VonageSms
from notiflow.providers.vonage.signature import verify_signature
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from tests.integration.contract.harness import (
    Emulator,
    Harness,
    Listener,
    Rejection,
    TimedClient,
    assert_result,
    configure_section,
    first_found,
    for_harness,
    listening,
    message,
    raw_post,
    send_once,
)

# the harness ----------------------------------------------------------------------------------


async def _vonage_unauthorized(settings: Settings) -> httpx.Response:
    v = settings.vonage
    return await raw_post(f"{v.base_url}/sms/json", data={
        "api_key": v.api_key, "api_secret": "not-the-secret", "from": v.from_name,
        "to": "14155550100", "text": "hi"})


VONAGE = Harness(
    name="vonage",
    sender=("+14155550111", "from", "14155550111"),
    channel=Channel.SMS,
    recipients={"ok": "+14155550100", "invalid": "+0123", "unroutable": "+447700900006",
                "barred": "+447700900007", "not_whitelisted": "+447700900029",
                "deactivated": "+447700900033", "opted_out": "+447700900101"},
    rejections=(Rejection("invalid", "invalid_recipient"),
                Rejection("unroutable", "unroutable"),
                Rejection("barred", "recipient_barred"),
                Rejection("not_whitelisted", "unverified_recipient"),
                Rejection("deactivated", "deactivated_recipient", deactivate=True),
                Rejection("opted_out", "unsubscribed", deactivate=True)),
    configure=configure_section("vonage", {
        "base_url": "base_url", "secret": "api_secret", "callback_url": "status_callback_url",
        "sender": "from_name"}),
    adapter=VonageSms,
    unauthorized=_vonage_unauthorized,
    unauthorized_body={"message-count": "1",
                       "messages": [{"status": "4", "error-text": "Bad Credentials"}]},
    wrong_secret=lambda: "x" * 16,
    provider_message_id=re.compile(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"),
    empty_body_rule=(Outcome.PERMANENT, "invalid_content"),
    unauthorized_status=200,
    recorded_to=lambda recipient: str(recipient).removeprefix("+"),
)

pytestmark = [pytest.mark.integration, for_harness(VONAGE)]


# Vonage's own cases ---------------------------------------------------------------------------


def vonage_documented_signature(secret: str, params: Mapping[str, str]) -> str:
    """Vonage's documented SHA-256 HMAC signature (every parameter but ``sig``, sorted by name,
    as ``&name=value`` with ``&`` and ``=`` in values replaced by ``_``; uppercase hex),
    written independently of the code under test."""
    data = ""
    for key in sorted(params):
        if key != "sig":
            data += "&" + key + "=" + params[key].replace("&", "_").replace("=", "_")
    return hmac.new(secret.encode(), data.encode(), hashlib.sha256).hexdigest().upper()


@dataclass
class Dlr:
    method: str
    content_type: str
    params: dict[str, str]


@dataclass
class DlrReceiver(Listener):
    """A loopback delivery-receipt receiver: GET query, form POST or JSON POST, answering 204
    as Vonage expects."""

    receipts: list[Dlr] = field(default_factory=list)
    status: ClassVar[int] = 204

    async def keep(self, request: web.Request) -> None:
        params = dict(request.query)
        raw = await request.read()
        if request.content_type == "application/json":
            params.update(orjson.loads(raw))
        elif raw:
            params.update(parse_qsl(raw.decode(), keep_blank_values=True))
        self.receipts.append(Dlr(request.method, request.content_type, params))

    async def wait(self, ref: str, count: int, timeout: float = 10.0) -> list[Dlr]:
        """The first ``count`` receipts whose ``client-ref`` is ``ref``."""
        return await first_found(
            self.arrived, lambda: [r for r in self.receipts if r.params.get("client-ref") == ref],
            count, timeout)


@pytest.fixture(scope="module")
async def dlr_receiver() -> AsyncIterator[DlrReceiver]:
    async with listening(DlrReceiver(), "/hooks/vonage", method="*") as rec:
        yield rec


async def test_vonage_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                  provider_settings: Settings) -> None:
    msg = message(harness, attempt=4)
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["client_ref"], record["type"], record["from"], record["parts"]) == (
        f"{msg.message_id}:4", "text", provider_settings.vonage.from_name, 1)
    unicode = message(harness, body="Ihr Code: 123456 ✓")
    assert_result(await adapter.send(unicode), Outcome.ACCEPTED, None)
    [record] = await emulator.records(unicode.message_id)
    assert record["type"] == "unicode"


@pytest.mark.parametrize("method", ["GET", "POST", "POST-JSON"])
async def test_vonage_delivery_receipts_are_signed(harness: Harness, method: str,
                                                   provider_settings: Settings,
                                                   emulator: Emulator,
                                                   dlr_receiver: DlrReceiver) -> None:
    v = provider_settings.vonage
    assert v.signature_secret is not None and v.api_key
    secret = v.signature_secret.get_secret_value()
    await emulator.configure(callback_delay_ms=10, dlr_method=method)
    msg = message(harness, attempt=3, body="x" * 200)
    result = await send_once(
        harness, harness.configure(provider_settings, {"callback_url": dlr_receiver.url}), msg)
    assert_result(result, Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert record["parts"] == 2
    receipts = await dlr_receiver.wait(f"{msg.message_id}:3", 2)
    assert result.provider_message_id in {r.params["messageId"] for r in receipts}
    assert len({r.params["messageId"] for r in receipts}) == 2
    for receipt in receipts:
        p = receipt.params
        assert receipt.method == ("GET" if method == "GET" else "POST")
        assert (receipt.content_type == "application/json") is (method == "POST-JSON")
        assert (p["status"], p["err-code"], p["msisdn"], p["to"], p["api-key"]) == (
            "delivered", "0", "14155550100", v.from_name, v.api_key)
        assert re.fullmatch(r"\d{10}", p["scts"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", p["message-timestamp"])
        assert p["nonce"] and abs(int(p["timestamp"]) - time.time()) < 60
        assert p["sig"] == vonage_documented_signature(secret, p)
        assert verify_signature(secret, p)
        assert not verify_signature(secret, {**p, "status": "failed"})
        assert not verify_signature("wrong", p)


async def test_vonage_failed_receipt(harness: Harness, provider_settings: Settings,
                                     emulator: Emulator, dlr_receiver: DlrReceiver) -> None:
    await emulator.configure(callback_delay_ms=10, undelivered_rate=1.0)
    msg = message(harness)
    assert_result(await send_once(harness, harness.configure(
        provider_settings, {"callback_url": dlr_receiver.url}), msg), Outcome.ACCEPTED, None)
    [receipt] = await dlr_receiver.wait(f"{msg.message_id}:1", 1)
    assert (receipt.params["status"], receipt.params["err-code"]) == ("failed", "1")


@pytest.mark.parametrize(("status", "expected"), [
    ("1", (Outcome.TRANSIENT, "rate_limited")),
    ("5", (Outcome.TRANSIENT, "server_error")),
    ("8", (Outcome.TRANSIENT, "account_inactive")),
    ("9", (Outcome.TRANSIENT, "quota_exceeded")),
    ("12", (Outcome.PERMANENT, "invalid_content")),
    ("15", (Outcome.TRANSIENT, "misconfigured")),
])
async def test_vonage_documented_statuses(harness: Harness, adapter: TimedClient,
                                          emulator: Emulator, status: str,
                                          expected: tuple[Outcome, str]) -> None:
    msg = message(harness, recipient=f"+447700900{int(status):03d}")
    result = await adapter.send(msg)
    assert_result(result, *expected)
    assert result.error_code == status
    assert result.retry_after_s == (1.0 if status == "1" else None)
    [record] = await emulator.records(msg.message_id)
    assert (record["status"], record["error_code"]) == (200, int(status))


async def test_vonage_signed_requests(harness: Harness, provider_settings: Settings,
                                      emulator: Emulator) -> None:
    v = provider_settings.vonage
    assert v.signature_secret is not None and v.api_secret is not None and v.api_key
    secret = v.signature_secret.get_secret_value()

    async def status_of(params: dict[str, str]) -> str:
        r = await raw_post(f"{v.base_url}/sms/json", data=params)
        assert r.status_code == 200
        return str(r.json()["messages"][0]["status"])

    params = {"api_key": v.api_key, "from": v.from_name, "to": "14155550100", "text": "hi",
              "client-ref": "msg_signed:1", "timestamp": str(int(time.time()))}
    signed = {**params, "sig": vonage_documented_signature(secret, params)}
    assert await status_of(signed) == "0"
    assert await status_of({**signed, "api_secret": v.api_secret.get_secret_value()}) == "32"
    assert await status_of({**params, "sig": "0" * 64}) == "14"
    stale = {**params, "timestamp": str(int(time.time()) - 3600)}
    assert await status_of({**stale, "sig": vonage_documented_signature(secret, stale)}) == "14"
    assert await status_of({k: x for k, x in params.items() if k != "timestamp"}) == "2"
