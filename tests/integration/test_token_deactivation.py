"""A recipient its provider calls dead, end to end: APNs 410, FCM
UNREGISTERED and an SMTP relay's ``550 5.1.1`` fail the message, mark the device token
inactive (push) and suppress the recipient; the next message to it ends ``SUPPRESSED`` with
the reason and never reaches the provider. Through the API, the P1 and P3 send flows, the
emulators and the reconciler."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.ops.procs import ManagedProcess
from tests.helpers import emulator_records, fresh_phone, message_row, wait_for

pytestmark = pytest.mark.integration


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def versions(api: str, tokens: dict[str, str]) -> dict[str, int]:
    out = {}
    for channel, subject in (("PUSH", "Sign in"), ("EMAIL", "Your code")):
        r = httpx.post(f"{api}/v1/templates", headers=bearer(tokens["acme"]), json={
            "template_id": f"dead-{channel.lower()}", "channel": channel,
            "body": "Your code is {{ code }}", "subject": subject})
        assert r.status_code in (200, 201), r.text
        out[channel] = int(r.json()["version"])
    return out


def send(api: str, token: str, channel: str, recipient: Any, version: int,
         tier: str = "P1") -> str:
    r = httpx.post(f"{api}/v1/messages", headers={
        **bearer(token), "Idempotency-Key": uuid.uuid4().hex}, json={
        "channel": channel, "tier": tier, "recipient": recipient,
        "template_id": f"dead-{channel.lower()}", "template_version": version,
        "variables": {"code": uuid.uuid4().hex[:6]}})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


TERMINAL = frozenset({"FAILED", "SUPPRESSED", "PROVIDER_ACCEPTED", "SENT", "DELIVERED"})


def ended(cql: Session, mid: str) -> dict[str, Any]:
    def row() -> dict[str, Any] | None:
        r = message_row(cql, mid)
        return r if r and r["status"] in TERMINAL else None

    return wait_for(row, timeout=30, what=f"a terminal status of {mid}")


PREFERENCE_TOPIC_S = 30.0
"""Bound on how long the send flow takes to read a suppression from ``notify.preferences``
(normally well under a second; the test machine runs two sessions at once)."""


@pytest.mark.parametrize(("platform", "token", "provider"), [
    ("ios", "dead" + uuid.uuid4().hex * 2, "apns"),
    ("android", f"unregistered-{uuid.uuid4().hex}", "fcm"),
], ids=["apns", "fcm"])
def test_a_dead_push_token_is_deactivated_and_its_next_message_suppressed(
        api: str, tokens: dict[str, str], versions: dict[str, int], send_p1: ManagedProcess,
        cql: Session, fakes: str, platform: str, token: str, provider: str) -> None:
    acme = tokens["acme"]
    owner = quote(fresh_phone(), safe="")
    device = f"{api}/v1/recipients/{owner}/devices/{token}"
    put = httpx.put(device, headers=bearer(acme), json={"platform": platform})
    assert put.status_code == 200, put.text
    assert httpx.get(device, headers=bearer(acme)).json()["active"] is True

    recipient = {"device_token": token, "platform": platform}
    first = ended(cql, send(api, acme, "PUSH", recipient, versions["PUSH"]))
    assert first["status"] == "FAILED"

    view = wait_for(lambda: (v := httpx.get(device, headers=bearer(acme)).json())
                    and v["active"] is False and v, timeout=15, what="the device inactive")
    assert view["deactivated_reason"].endswith(":unregistered")
    assert view["deactivated_reason"].split(":")[0].startswith(provider)
    assert view["suppressed"] == "token_deactivated"

    def next_suppressed() -> str | None:
        """A new message's id once it ends suppressed. Until the send flow has read the
        suppression from its preference topic, a message still meets the dead token."""
        mid = send(api, acme, "PUSH", recipient, versions["PUSH"])
        row = ended(cql, mid)
        if (row["status"], row["reason"]) == ("SUPPRESSED", "token_deactivated"):
            return mid
        assert (row["status"], row["reason"]) == ("FAILED", "unregistered"), row
        return None

    mid = wait_for(next_suppressed, timeout=PREFERENCE_TOPIC_S, interval=0.5,
                   what="a message taken after the send flow read the suppression")
    assert not emulator_records(fakes, mid, (provider,))

    again = httpx.put(device, headers=bearer(acme), json={"platform": platform}).json()
    assert (again["active"], again["suppressed"]) == (True, None)


def test_a_hard_bounce_suppresses_the_address_for_the_next_message(
        api: str, tokens: dict[str, str], versions: dict[str, int], send_p3: ManagedProcess,
        cql: Session, fakes: str) -> None:
    """P3 email goes to the SMTP relay first; its emulator answers ``550 5.1.1`` at ``RCPT``
    for an address at ``bounce.example.com``: the message fails and the address is
    suppressed."""
    acme = tokens["acme"]
    address = f"gone-{uuid.uuid4().hex[:8]}@bounce.example.com"
    first = ended(cql, send(api, acme, "EMAIL", address, versions["EMAIL"], "P3"))
    assert first["status"] == "FAILED"
    state = wait_for(lambda: (s := httpx.get(
        f"{api}/v1/recipients/{quote(address, safe='')}/preferences",
        headers=bearer(acme))).status_code == 200 and s.json(), timeout=15,
        what="the address suppressed")
    assert state["suppressed"] == "hard_bounce"
    sent: list[str] = []

    def next_suppressed() -> str | None:
        """The send flows learn the suppression from notify.preferences, a moment after the
        API can read it: a message sent in that moment is refused by the relay again."""
        sent.append(send(api, acme, "EMAIL", address, versions["EMAIL"], "P3"))
        row = ended(cql, sent[-1])
        return sent[-1] if (row["status"], row["reason"]) == ("SUPPRESSED",
                                                              "hard_bounce") else None

    mid = wait_for(next_suppressed, timeout=60, what="a next message suppressed")
    assert len(sent) <= 3
    assert not emulator_records(fakes, mid, ("smtp", "sendgrid"))


def test_an_unknown_device_is_404(api: str, tokens: dict[str, str]) -> None:
    r = httpx.get(f"{api}/v1/recipients/%2B14155550000/devices/nope-{uuid.uuid4().hex}",
                  headers=bearer(tokens["acme"]))
    assert r.status_code == 404
