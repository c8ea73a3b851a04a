"""SES events through SNS into the real API subprocess: the SES adapter sends to the emulator,
whose SNS topic asks the API to confirm its subscription, then posts signed notifications to
``/webhooks/ses``; the API fetches the signing certificate from the emulator, verifies, and
produces normalised receipts to ``notify.receipts``. PyPI's ``aws-sns-message-validator``
checks every SignatureVersion 1 post the emulator made, fetching the certificate itself.
Forged posts are refused with nothing produced. With the reconciler, an SES complaint about
a message ends it DELIVERED and suppresses its address."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from cassandra.cluster import Session
from sns_message_validator import SNSMessageValidator

from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.ops.procs import ManagedProcess
from notiflow.providers.ses.client import SesEmail
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings
from tests.helpers import hold, read_topic, wait_for
from tests.integration.test_receipt_webhooks import email_template, send, status_is

pytestmark = pytest.mark.integration

FORGED_QUIET_S = 1.0
"""How long a forged event has to show up as a receipt (it must not)."""

__all__ = ["email_template"]


def ses_receipts(stack: Settings) -> dict[str, list[dict[str, Any]]]:
    """provider_message_id → SES receipts the API produced to ``notify.receipts`` (not the
    reconciler's parked copies of those it could not correlate yet)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for msg in read_topic(stack, stack.receipts_topic):
        doc = orjson.loads(msg.value())
        if doc.get("provider_id") == stack.ses.provider_id and not doc.get("parked_since"):
            found.setdefault(doc["provider_message_id"], []).append(doc)
    return found


def ses_send(stack: Settings, to: str, message_id: str, attempt: int = 1) -> str:
    """Send through the SES adapter (the emulator's key pair); the SES ``MessageId``."""
    config = stack.ses.model_copy(update={
        "access_key_id": stack.fakes_ses_access_key_id,
        "secret_access_key": stack.fakes_ses_secret_access_key})

    async def go() -> str:
        adapter = await SesEmail.open(config, timeout=10.0)
        try:
            result = await adapter.send(OutboundMessage(
                message_id=message_id, attempt=attempt, tenant_id="acme",
                channel=Channel.EMAIL, tier=Tier.P1, recipient=to, body="Order shipped",
                subject="Your order"))
        finally:
            await adapter.aclose()
        assert result.outcome is Outcome.ACCEPTED, result
        assert result.provider_message_id is not None
        return result.provider_message_id

    return asyncio.run(go())


@pytest.fixture
def topic(fakes: str, api: str) -> Iterator[None]:
    """The SES emulator with fresh SNS state: the next event asks the API to confirm its
    subscription again."""
    r = httpx.post(f"{fakes}/_admin/ses/reset")
    assert r.status_code == 200, r.text
    yield
    httpx.post(f"{fakes}/_admin/ses/config", json={"signature_version": "1",
                                                   "event_delay_ms": 50.0})


def sns_posts(fakes: str) -> dict[str, Any]:
    return httpx.get(f"{fakes}/_admin/ses/sns").json()


def test_ses_events_become_receipts_after_the_api_confirms(
        stack: Settings, fakes: str, api: str, topic: None) -> None:
    run = uuid.uuid4().hex[:10]
    cases = {"ada@example.com": [("DELIVERED", "delivery", None)],
             "kim@bounce.example.com": [("BOUNCED", "bounce", "5.1.1")],
             "lee@transient.example.com": [("FAILED", "transient", "4.2.2")],
             "sam@complaint.example.com": [("DELIVERED", "delivery", None),
                                           ("DELIVERED", "complaint", "abuse")]}
    sent = {ses_send(stack, to, f"msg_ses{run}{i}", attempt=2): (to, f"msg_ses{run}{i}")
            for i, to in enumerate(cases)}

    def all_in() -> dict[str, list[dict[str, Any]]] | None:
        found = ses_receipts(stack)
        mine = {sid: found.get(sid, []) for sid in sent}
        done = all(len(mine[sid]) >= len(cases[to]) for sid, (to, _) in sent.items())
        return mine if done else None

    got = wait_for(all_in, timeout=60, what="SES receipts on notify.receipts")
    for sid, (to, mid) in sent.items():
        seen = sorted((r["status"], r["raw_status"], r.get("error_code")) for r in got[sid])
        assert seen == sorted(cases[to]), to
        assert {(r["message_id"], r["attempt"]) for r in got[sid]} == {(mid, 2)}
        assert all(r["provider_event_id"] for r in got[sid])
    stats = sns_posts(fakes)
    assert f"{api}/webhooks/ses" in stats["confirmed"]
    assert stats["held"] == 0 and stats["failed"] == 0
    posts = stats["posts"]
    confirmations = [p for p in posts if p["Type"] == "SubscriptionConfirmation"]
    notifications = [p for p in posts if p["Type"] == "Notification"]
    assert confirmations and len(notifications) >= 4 + 5
    validator = SNSMessageValidator(cert_url_regex=r"^http://127\.0\.0\.1:\d+/")
    for post in posts:
        assert post["SignatureVersion"] == "1"
        validator.validate_message(post)


def test_signature_version_2(stack: Settings, fakes: str, api: str,
                             topic: None) -> None:
    r = httpx.post(f"{fakes}/_admin/ses/config", json={"signature_version": "2"})
    assert r.status_code == 200, r.text
    sid = ses_send(stack, "ada@example.com", f"msg_sesv2{uuid.uuid4().hex[:8]}")
    wait_for(lambda: ses_receipts(stack).get(sid), timeout=60, what="a receipt signed v2")
    assert {p["SignatureVersion"] for p in sns_posts(fakes)["posts"]} == {"2"}


def post(api: str, doc: Any, kind: str | None = None) -> httpx.Response:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    headers = {"Content-Type": "text/plain; charset=UTF-8"}
    if kind or isinstance(doc, dict):
        headers["x-amz-sns-message-type"] = kind or doc.get("Type", "")
    return httpx.post(f"{api}/webhooks/ses", content=body, headers=headers)


def test_forged_posts_are_refused_and_produce_nothing(
        stack: Settings, fakes: str, api: str, topic: None) -> None:
    sid = ses_send(stack, "ada@example.com", f"msg_sesforged{uuid.uuid4().hex[:6]}")
    wait_for(lambda: ses_receipts(stack).get(sid), timeout=60, what="the genuine receipt")
    [genuine] = [p for p in sns_posts(fakes)["posts"]
                 if p["Type"] == "Notification" and '"Delivery"' in p["Message"]
                 and sid in p["Message"]]
    forged_id = str(uuid.uuid4())
    event = orjson.loads(genuine["Message"])
    event["eventType"] = "Bounce"
    event["bounce"] = {"bounceType": "Permanent", "bouncedRecipients": []}
    cases = [
        ({**genuine, "MessageId": forged_id, "Message": orjson.dumps(event).decode()},
         "invalid_signature"),
        ({**genuine, "MessageId": forged_id, "SigningCertURL":
          "https://sns.us-east-1.amazonaws.com.evil.example/x.pem"}, "untrusted_url"),
        ({**genuine, "MessageId": forged_id,
          "TopicArn": "arn:aws:sns:us-east-1:000000000000:other"}, "wrong_account"),
    ]
    for doc, reason in cases:
        r = post(api, doc)
        assert (r.status_code, r.json()["reason"]) == (403, reason), r.text
    for body, kind, reason in ((b"not json", None, "invalid_json"),
                               (orjson.dumps({"Type": "Notification"}), None, "not_sns"),
                               (orjson.dumps({**genuine, "Type": "SubscriptionConfirmation"}),
                                None, "not_sns")):
        r = post(api, body, kind)
        assert (r.status_code, r.json()["reason"]) == (400, reason), r.text
    replay = post(api, genuine)
    assert replay.status_code == 200 and replay.json()["receipts"] == 1, replay.text
    hold(FORGED_QUIET_S)
    found = ses_receipts(stack)[sid]
    assert forged_id not in {r["provider_event_id"] for r in found}
    assert {r["provider_event_id"] for r in found} == {genuine["MessageId"]}


def test_an_ses_complaint_about_another_providers_attempt_changes_nothing(
        stack: Settings, api: str, tokens: dict[str, str], email_template: int,
        send_p1: ManagedProcess, reconciler: ManagedProcess, cql: Session,
        topic: None) -> None:
    """SES is not an email route of the development environment, so the message goes out
    through its P1 route. A genuine, signed SES delivery and complaint whose tags name that
    message's attempt are not the attempt's receipts: the reconciler drops them as forged
    (the attempt was sent through another provider), the message keeps its status and the
    address is not suppressed."""
    to = f"c{uuid.uuid4().hex[:8]}@complaint.example.com"
    mid = send(api, tokens["acme"], channel="EMAIL", tier="P1", recipient=to,
               template="order-mail", version=email_template, variables={"order": "C-1"})
    wait_for(lambda: status_is(cql, mid, "PROVIDER_ACCEPTED", "DELIVERED"), timeout=90,
             what="the message sent")
    ses_send(stack, to, mid, attempt=1)
    wait_for(lambda: f"of {mid} was sent through" in reconciler.log_path.read_text(
        errors="replace"), timeout=60, what="the SES receipts dropped as forged")
    events = cql.execute("SELECT status, source FROM message_events WHERE message_id = %s",
                         (mid,))
    assert "receipt.ses" not in {e["source"] for e in events}
    assert status_is(cql, mid, "PROVIDER_ACCEPTED", "DELIVERED")
    again = send(api, tokens["acme"], channel="EMAIL", tier="P1", recipient=to,
                 template="order-mail", version=email_template, variables={"order": "C-2"})
    wait_for(lambda: status_is(cql, again, "PROVIDER_ACCEPTED", "DELIVERED"), timeout=60,
             what="the next message sent, not suppressed")
