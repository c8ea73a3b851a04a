"""Twilio status callbacks: signed by the emulator, verified by the API, merged by the
reconciler; forged ones are refused; duplicates and disorder never regress a status."""

from __future__ import annotations

import uuid

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.ops.procs import ManagedProcess
from notiflow.providers.twilio.signature import signature
from notiflow.settings import Settings
from tests.helpers import message_row, wait_for

pytestmark = pytest.mark.integration


def send(api: str, token: str, version: int) -> str:
    r = httpx.post(f"{api}/v1/messages", headers={
        "Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex},
        json={"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
              "template_id": "otp", "template_version": version,
              "variables": {"code": uuid.uuid4().hex[:6]}})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def post_callback(stack: Settings, api: str, query: str, params: dict[str, str],
                  sign: bool = True, token: str | None = None) -> httpx.Response:
    assert stack.twilio.status_callback_url is not None
    url = f"{stack.twilio.status_callback_url}?{query}"
    secret = token or stack.twilio.auth_token.get_secret_value()
    headers = {"X-Twilio-Signature": signature(secret, url, params)} if sign else {}
    return httpx.post(f"{api}/webhooks/twilio?{query}", data=params, headers=headers)


def test_emulator_callbacks_drive_status_to_delivered(
        api: str, tokens: dict[str, str], otp_template: dict[str, int], send_p1: ManagedProcess,
        cql: Session) -> None:
    mid = send(api, tokens["acme"], otp_template["acme"])
    wait_for(lambda: (message_row(cql, mid) or {}).get("status") == "DELIVERED",
             what="DELIVERED from the provider's callbacks")

    def history() -> set[str]:
        return {r["status"] for r in cql.execute(
            "SELECT status, source FROM message_events WHERE message_id = %s", (mid,))}

    # the reconciler writes the history row just after the status compare-and-set
    wait_for(lambda: {"PROVIDER_ACCEPTED", "SENT", "DELIVERED"} <= history(), timeout=10,
             what="the history of every status")


def test_forged_and_unsigned_callbacks_are_refused(stack: Settings, api: str,
                                                   cql: Session) -> None:
    mid = f"msg_forged_{uuid.uuid4().hex}"
    params = {"MessageSid": "SM" + uuid.uuid4().hex, "MessageStatus": "delivered",
              "AccountSid": stack.twilio.account_sid}
    query = f"message_id={mid}&attempt=1"
    forged = post_callback(stack, api, query, params, token="not-the-auth-token")
    assert forged.status_code == 403
    assert forged.json()["reason"] == "invalid_signature"
    assert post_callback(stack, api, query, params, sign=False).status_code == 403
    tampered = post_callback(stack, api, query, params)
    assert tampered.status_code == 200
    ok_sig = signature(stack.twilio.auth_token.get_secret_value(),
                       f"{stack.twilio.status_callback_url}?{query}", params)
    swapped = httpx.post(f"{api}/webhooks/twilio?message_id=other&attempt=1", data=params,
                         headers={"X-Twilio-Signature": ok_sig})
    assert swapped.status_code == 403


def test_duplicated_and_shuffled_receipts_never_regress(
        stack: Settings, api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p1: ManagedProcess, cql: Session) -> None:
    mid = send(api, tokens["acme"], otp_template["acme"])
    row = wait_for(lambda: (lambda r: r if r and r["provider_message_id"] else None)(
        message_row(cql, mid)), what="provider message id")
    sid = row["provider_message_id"]
    query = f"message_id={mid}&attempt=1"
    for st in ["delivered", "sent", "delivered", "failed", "sent", "queued"]:
        params = {"MessageSid": sid, "MessageStatus": st, "AccountSid": stack.twilio.account_sid}
        assert post_callback(stack, api, query, params).status_code == 200
    wait_for(lambda: (message_row(cql, mid) or {}).get("status") == "DELIVERED")
    receipts = [r for r in cql.execute(
        "SELECT status, source FROM message_events WHERE message_id = %s", (mid,))
        if r["source"] == "receipt.twilio"]
    assert len(receipts) == len({r["status"] for r in receipts})
    assert message_row(cql, mid)["status"] == "DELIVERED"
