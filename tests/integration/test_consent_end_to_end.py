"""A person's own "stop", end to end through the API, the P3 send flow and the emulators:
an SMS STOP texted to the platform's Twilio number and a one-click unsubscribe POSTed as a
mailbox provider sends it each make the very next marketing message ``SUPPRESSED`` (the send
flow re-reads marketing consent from Cassandra), and START lets SMS through again."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session
from twilio.request_validator import RequestValidator

from notiflow.correlation import CorrelationKeys
from notiflow.ops.procs import ManagedProcess
from notiflow.redact import recipient_hash
from notiflow.schemas.enums import Category
from notiflow.settings import Settings
from notiflow.unsubscribe import ONE_CLICK, UnsubscribeKeys, Unsubscription
from tests.helpers import SUCCESS, emulator_records, fresh_email, fresh_phone, message_row, wait_for

pytestmark = pytest.mark.integration

TERMINAL = SUCCESS | {"FAILED", "SUPPRESSED"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def versions(api: str, tokens: dict[str, str]) -> dict[str, int]:
    out = {}
    for channel in ("SMS", "EMAIL"):
        r = httpx.post(f"{api}/v1/templates", headers=bearer(tokens["acme"]), json={
            "template_id": f"news-{channel.lower()}", "channel": channel,
            "body": "News {{ n }}", "subject": "News" if channel == "EMAIL" else None})
        assert r.status_code in (200, 201), r.text
        out[channel] = int(r.json()["version"])
    return out


def marketing(api: str, token: str, channel: str, recipient: str, version: int) -> str:
    r = httpx.post(f"{api}/v1/messages", headers={
        **bearer(token), "Idempotency-Key": uuid.uuid4().hex}, json={
        "channel": channel, "tier": "P3", "category": "marketing", "recipient": recipient,
        "template_id": f"news-{channel.lower()}", "template_version": version,
        "variables": {"n": uuid.uuid4().hex[:6]}})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def ended(cql: Session, mid: str) -> dict[str, Any]:
    return wait_for(lambda: (r := message_row(cql, mid)) and r["status"] in TERMINAL and r,
                    timeout=30, what=f"a terminal status of {mid}")


def texted(api: str, stack: Settings, phone: str, body: str) -> None:
    params = {"MessageSid": "SM" + uuid.uuid4().hex, "From": phone,
              "To": stack.twilio.from_number, "Body": body}
    token = stack.twilio.auth_token.get_secret_value() if stack.twilio.auth_token else ""
    signed = RequestValidator(token).compute_signature(stack.twilio.inbound_url or "", params)
    r = httpx.post(f"{api}/webhooks/twilio/inbound", data=params,
                   headers={"X-Twilio-Signature": signed})
    assert r.status_code == 200, r.text


def test_a_texted_stop_suppresses_the_next_marketing_sms_and_start_restores_it(
        api: str, tokens: dict[str, str], versions: dict[str, int], send_p3: ManagedProcess,
        cql: Session, stack: Settings, fakes: str) -> None:
    acme, phone = tokens["acme"], fresh_phone()
    assert ended(cql, marketing(api, acme, "SMS", phone, versions["SMS"]))["status"] in SUCCESS

    texted(api, stack, phone, "STOP")
    stopped = ended(cql, marketing(api, acme, "SMS", phone, versions["SMS"]))
    assert (stopped["status"], stopped["reason"]) == ("SUPPRESSED", "unsubscribed")
    assert not emulator_records(fakes, stopped["message_id"])

    texted(api, stack, phone, "start")
    sent: list[str] = []

    def next_sent() -> str | None:
        """The send flow's joined view of notify.preferences may hold the suppression a
        moment after Cassandra has dropped it."""
        sent.append(marketing(api, acme, "SMS", phone, versions["SMS"]))
        return sent[-1] if ended(cql, sent[-1])["status"] in SUCCESS else None

    wait_for(next_sent, timeout=60, what="an SMS sent after START")
    assert len(sent) <= 3


def test_a_one_click_post_suppresses_the_very_next_marketing_email(
        api: str, tokens: dict[str, str], versions: dict[str, int], send_p3: ManagedProcess,
        cql: Session, stack: Settings) -> None:
    acme, address = tokens["acme"], fresh_email()
    keys = UnsubscribeKeys.of(CorrelationKeys.from_settings(stack))
    link = "/unsubscribe/" + keys.issue(Unsubscription(
        "acme", recipient_hash("acme", address), Category.MARKETING, datetime.now(UTC)))
    r = httpx.post(f"{api}{link}", content=ONE_CLICK,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    started = time.monotonic()
    mid = marketing(api, acme, "EMAIL", address, versions["EMAIL"])
    taken = time.monotonic() - started
    row = ended(cql, mid)
    assert (row["status"], row["reason"]) == ("SUPPRESSED", "opted_out")
    assert taken < 1.0, f"the next message was accepted {taken:.2f} s after the POST"
    account = httpx.post(f"{api}/v1/messages", headers={
        **bearer(acme), "Idempotency-Key": uuid.uuid4().hex}, json={
        "channel": "EMAIL", "tier": "P3", "category": "account", "recipient": address,
        "template_id": "news-email", "template_version": versions["EMAIL"],
        "variables": {"n": "1"}})
    assert account.status_code == 202
    assert ended(cql, account.json()["message_id"])["status"] != "SUPPRESSED"
