"""Inbound SMS keywords against the real API: a STOP posted as Twilio and Vonage post it
(signed by Twilio's own ``RequestValidator``, and with Vonage's ``sig``) suppresses the number,
so the next message to its user goes by email; START restores SMS; HELP is answered in
TwiML; a forged or unsigned post changes nothing."""

from __future__ import annotations

import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from twilio.request_validator import RequestValidator

from notiflow.providers.vonage.signature import signature as vonage_sig
from notiflow.settings import Settings
from tests.helpers import fresh_email, fresh_phone

pytestmark = pytest.mark.integration

TEMPLATES = {"SMS": "inbound-sms", "EMAIL": "inbound-email"}
ACME_NUMBER = "+14155550100"
"""A number of tenant ``acme``'s own (its ``senders`` in the development tenants)."""


@pytest.fixture(scope="module")
def templates(client: httpx.Client, auth: Callable[..., dict[str, str]]) -> None:
    for channel, template_id in TEMPLATES.items():
        r = client.post("/v1/templates", headers=auth("acme"), json={
            "template_id": template_id, "version": 1, "channel": channel,
            "subject": "Hi" if channel == "EMAIL" else None, "body": "Hello"})
        assert r.status_code in (200, 201), r.text


@pytest.fixture
def phone_user(client: httpx.Client, auth: Callable[..., dict[str, str]],
               templates: None) -> tuple[str, str]:
    uid, phone = f"user-{uuid.uuid4().hex[:10]}", fresh_phone()
    r = client.put(f"/v1/users/{uid}", headers=auth("acme"), json={
        "phones": [phone], "emails": [fresh_email()], "in_app": False})
    assert r.status_code == 201, r.text
    return uid, phone


def twilio_post(client: httpx.Client, stack: Settings, params: dict[str, str],
                token: str | None = None) -> httpx.Response:
    secret = token or (stack.twilio.auth_token.get_secret_value()
                       if stack.twilio.auth_token else "")
    url = stack.twilio.inbound_url or ""
    header = RequestValidator(secret).compute_signature(url, params)
    return client.post("/webhooks/twilio/inbound", data=params,
                       headers={"X-Twilio-Signature": header})


def text(phone: str, to: str, body: str) -> dict[str, str]:
    return {"MessageSid": "SM" + uuid.uuid4().hex, "AccountSid": "AC" + "0" * 32,
            "From": phone, "To": to, "Body": body, "NumSegments": "1"}


def reply_of(r: httpx.Response) -> str | None:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/xml")
    message = ET.fromstring(r.content).find("Message")
    return None if message is None else message.text


def channel_for(client: httpx.Client, auth: Callable[..., dict[str, str]], uid: str
                ) -> tuple[list[str], list[dict[str, Any]]]:
    r = client.post("/v1/messages", headers=auth("acme"), json={
        "recipient": f"user:{uid}", "tier": "P3", "category": "marketing",
        "channels": [{"channel": c, "template_id": t, "template_version": 1}
                     for c, t in TEMPLATES.items()]})
    assert r.status_code == 202, r.text
    return [m["channel"] for m in r.json()["messages"]], r.json()["skipped"]


def suppressed(client: httpx.Client, auth: Callable[..., dict[str, str]],
               phone: str) -> str | None:
    r = client.get(f"/v1/recipients/{quote(phone, safe='')}/preferences", headers=auth("acme"))
    assert r.status_code == 200, r.text
    return r.json()["suppressed"]


def test_stop_moves_the_next_message_to_email_and_start_brings_it_back(
        client: httpx.Client, auth: Callable[..., dict[str, str]], stack: Settings,
        phone_user: tuple[str, str]) -> None:
    uid, phone = phone_user
    assert channel_for(client, auth, uid)[0] == ["SMS"]

    stop = twilio_post(client, stack, text(phone, stack.twilio.from_number, "Stop"))
    assert reply_of(stop) == stack.sms_replies.stop
    assert suppressed(client, auth, phone) == "unsubscribed"
    channels, skipped = channel_for(client, auth, uid)
    assert channels == ["EMAIL"]
    assert skipped[0] == {"channel": "SMS", "index": 0, "reason": "unsubscribed"}

    start = twilio_post(client, stack, text(phone, stack.twilio.from_number, "START"))
    assert reply_of(start) == stack.sms_replies.start
    assert suppressed(client, auth, phone) is None
    assert channel_for(client, auth, uid)[0] == ["SMS"]


def test_help_is_answered_and_other_texts_change_nothing(
        client: httpx.Client, auth: Callable[..., dict[str, str]], stack: Settings) -> None:
    phone = fresh_phone()
    assert reply_of(twilio_post(client, stack, text(phone, ACME_NUMBER, "help"))) == (
        stack.sms_replies.help)
    assert reply_of(twilio_post(client, stack, text(phone, ACME_NUMBER, "stop please"))) is None
    r = client.get(f"/v1/recipients/{quote(phone, safe='')}/preferences", headers=auth("acme"))
    assert r.status_code == 404 or r.json()["suppressed"] is None


def test_a_forged_or_unsigned_text_changes_nothing(
        client: httpx.Client, auth: Callable[..., dict[str, str]], stack: Settings) -> None:
    phone = fresh_phone()
    forged = twilio_post(client, stack, text(phone, ACME_NUMBER, "STOP"), token="x" * 32)
    assert (forged.status_code, forged.json()["reason"]) == (403, "invalid_signature")
    unsigned = client.post("/webhooks/twilio/inbound", data=text(phone, ACME_NUMBER, "STOP"))
    assert unsigned.status_code == 403
    not_a_text = twilio_post(client, stack, {"MessageSid": "SM1", "Body": "STOP"})
    assert (not_a_text.status_code, not_a_text.json()["reason"]) == (400, "unknown_callback")
    r = client.get(f"/v1/recipients/{quote(phone, safe='')}/preferences", headers=auth("acme"))
    assert r.status_code == 404 or r.json()["suppressed"] is None


def test_vonage_stop_and_start_to_a_tenants_own_number(
        client: httpx.Client, auth: Callable[..., dict[str, str]], stack: Settings,
        phone_user: tuple[str, str]) -> None:
    uid, phone = phone_user
    secret = stack.vonage.signature_secret
    assert secret is not None

    def post(body: str) -> httpx.Response:
        params = {"msisdn": phone.removeprefix("+"), "to": ACME_NUMBER.removeprefix("+"),
                  "messageId": uuid.uuid4().hex, "text": body, "type": "text",
                  "api-key": stack.vonage.api_key or "", "timestamp": str(int(time.time())),
                  "nonce": uuid.uuid4().hex}
        params["sig"] = vonage_sig(secret.get_secret_value(), params)
        return client.post("/webhooks/vonage/inbound", json=params)

    r = post("STOP")
    assert (r.status_code, r.json()) == (200, {"keyword": "STOP"})
    assert suppressed(client, auth, phone) == "unsubscribed"
    assert channel_for(client, auth, uid)[0] == ["EMAIL"]
    assert post("unstop").json() == {"keyword": "START"}
    assert suppressed(client, auth, phone) is None
    unsigned = client.get("/webhooks/vonage/inbound",
                          params={"msisdn": "1", "to": "2", "messageId": "3", "text": "STOP"})
    assert unsigned.status_code == 403
