"""SendGrid (email): its harness, the v3 Mail Send wire format, and the signed Event Webhook,
verified by an independent implementation of SendGrid's documented ECDSA check."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from notiflow.adapters.providers.base import Outcome
from notiflow.providers.sendgrid.client import SendGridEmail
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


async def _sendgrid_unauthorized(settings: Settings) -> httpx.Response:
    s = settings.sendgrid
    return await raw_post(
        f"{s.base_url}/v3/mail/send", headers={"Authorization": "Bearer SG.not-the-key"},
        json={"personalizations": [{"to": [{"email": "ada@example.com"}]}],
              "from": {"email": s.from_email}, "subject": "hi",
              "content": [{"type": "text/plain", "value": "hi"}]})


SENDGRID = Harness(
    name="sendgrid",
    sender=("billing@acme.example", "from", "billing@acme.example"),
    channel=Channel.EMAIL,
    recipients={"ok": "ada@example.com", "invalid": "nobody@invalid.example.com",
                "malformed": "not-an-address"},
    rejections=(Rejection("invalid", "invalid_recipient"),
                Rejection("malformed", "invalid_recipient")),
    configure=configure_section("sendgrid", {
        "base_url": "base_url", "secret": "api_key", "sender": "from_email"}),
    adapter=SendGridEmail,
    unauthorized=_sendgrid_unauthorized,
    unauthorized_body={"errors": [{
        "message": "The provided authorization grant is invalid, expired, or revoked",
        "field": None, "help": None}]},
    wrong_secret=lambda: "SG.wrong." + "x" * 32,
    provider_message_id=re.compile(r"[A-Za-z0-9_-]{22}"),
    empty_body_rule=(Outcome.PERMANENT, "invalid_content"),
    exact_retry_after=False,
)

pytestmark = [pytest.mark.integration, for_harness(SENDGRID)]


@dataclass
class EventPost:
    body: bytes
    headers: dict[str, str]

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(orjson.loads(self.body))


@dataclass
class EventReceiver(Listener):
    """A loopback Event Webhook receiver (JSON arrays)."""

    posts: list[EventPost] = field(default_factory=list)

    async def keep(self, request: web.Request) -> None:
        self.posts.append(EventPost(await request.read(), dict(request.headers)))

    async def wait(self, message_id: str, count: int,
                   timeout: float = 10.0) -> list[dict[str, Any]]:
        """The first ``count`` events whose ``message_id`` custom arg is ``message_id``."""
        return await first_found(
            self.arrived, lambda: [e for p in self.posts for e in p.events
                                   if e.get("message_id") == message_id], count, timeout)


@pytest.fixture(scope="module")
async def event_receiver() -> AsyncIterator[EventReceiver]:
    async with listening(EventReceiver(), "/hooks/email") as rec:
        yield rec


# SendGrid's own cases -------------------------------------------------------------------------


def sendgrid_documented_verify(public_key_b64: str, payload: bytes, signature_b64: str,
                               timestamp: str) -> bool:
    """SendGrid's documented check (ECDSA P-256 / SHA-256 over timestamp + raw body, key as
    base64 DER), written independently of the code under test."""
    key = serialization.load_der_public_key(base64.b64decode(public_key_b64))
    assert isinstance(key, ec.EllipticCurvePublicKey)
    try:
        key.verify(base64.b64decode(signature_b64), timestamp.encode() + payload,
                   ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


async def test_sendgrid_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                    provider_settings: Settings) -> None:
    msg = message(harness, subject="Your receipt")
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["subject"], record["from"], record["status"]) == (
        "Your receipt", provider_settings.sendgrid.from_email, 202)


async def test_sendgrid_missing_subject_is_permanent(harness: Harness, adapter: TimedClient,
                                                     emulator: Emulator) -> None:
    result = await adapter.send(message(harness, subject=None))
    assert_result(result, Outcome.PERMANENT, "invalid_content")
    assert result.error_code == "http_400:subject"


async def test_sendgrid_unverified_sender_is_misconfiguration(harness: Harness,
                                                              provider_settings: Settings,
                                                              emulator: Emulator) -> None:
    wrong = harness.configure(provider_settings, {"sender": "noreply@unverified.example.com"})
    result = await send_once(harness, wrong, message(harness))
    assert_result(result, Outcome.TRANSIENT, "misconfigured")
    assert result.error_code == "http_403:from"


async def test_sendgrid_events_are_off_by_default(harness: Harness, adapter: TimedClient,
                                                  emulator: Emulator) -> None:
    assert (await emulator.config())["callbacks_enabled"] is False
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    assert (await emulator.stats())["callbacks"]["scheduled"] == 0


async def test_sendgrid_event_webhook_is_signed(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator,
                                                event_receiver: EventReceiver,
                                                provider_settings: Settings) -> None:
    public_key = provider_settings.sendgrid.event_webhook_public_key
    assert public_key is not None
    key = await emulator.http.get(f"{emulator.base}/_admin/sendgrid/event-webhook-key")
    assert key.json() == {"public_key": public_key}
    await emulator.configure(callbacks_enabled=True, callback_delay_ms=10,
                             event_webhook_url=event_receiver.url)
    msg = message(harness, attempt=3)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    events = await event_receiver.wait(msg.message_id, 2)
    assert [e["event"] for e in events] == ["processed", "delivered"]
    for event in events:
        assert event["attempt"] == "3" and event["email"] == msg.recipient
        assert event["sg_message_id"].startswith(f"{result.provider_message_id}.")
    assert len({e["sg_event_id"] for e in events}) == 2
    posts = [p for p in event_receiver.posts
             if any(e.get("message_id") == msg.message_id for e in p.events)]
    for post in posts:
        sig = post.headers["X-Twilio-Email-Event-Webhook-Signature"]
        ts = post.headers["X-Twilio-Email-Event-Webhook-Timestamp"]
        assert abs(int(ts) - time.time()) < 60
        assert post.body.endswith(b"\r\n")
        assert sendgrid_documented_verify(public_key, post.body, sig, ts)
        assert not sendgrid_documented_verify(public_key, post.body + b" ", sig, ts)
        assert not sendgrid_documented_verify(public_key, post.body, sig, str(int(ts) + 1))


async def test_sendgrid_bounce_event(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                     event_receiver: EventReceiver) -> None:
    await emulator.configure(callbacks_enabled=True, callback_delay_ms=10,
                             event_webhook_url=event_receiver.url)
    msg = message(harness, recipient="grace@bounce.example.com")
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    processed, bounce = await event_receiver.wait(msg.message_id, 2)
    assert processed["event"] == "processed"
    assert (bounce["event"], bounce["type"], bounce["status"]) == ("bounce", "bounce", "5.1.1")
