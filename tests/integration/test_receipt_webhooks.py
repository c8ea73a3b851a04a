"""Provider receipts other than Twilio's, through the real API subprocess: SendGrid Event
Webhook batches, Vonage delivery receipts and SMTP DSNs. Forged, unsigned and stale posts are
refused with nothing on ``notify.receipts``; genuine ones become normalised receipts; with the
send flows, the emulators and the reconciler, messages end DELIVERED / BOUNCED in Cassandra and
duplicated or shuffled receipts never regress them."""

from __future__ import annotations

import random
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from cassandra.cluster import Session
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from notiflow.adapters.kafka_io import header
from notiflow.correlation import CorrelationKeys
from notiflow.ops.procs import ManagedProcess
from notiflow.providers.sendgrid.signature import (
    EVENT_SIGNATURE_HEADER,
    EVENT_TIMESTAMP_HEADER,
    event_signature,
)
from notiflow.providers.smtp.bounces import bounce_address
from notiflow.providers.smtp.emulator import build_dsn
from notiflow.providers.vonage.signature import signature as vonage_signature
from notiflow.settings import Settings
from tests.helpers import create_template, hold, message_row, read_topic, wait_for

pytestmark = pytest.mark.integration

PHONE = "+14155552671"


# helpers -------------------------------------------------------------------------------


def receipts_by_event(stack: Settings, provider_id: str) -> dict[str, tuple[dict[str, Any], Any]]:
    """provider_event_id → (receipt, Kafka message) of every receipt of ``provider_id`` now on
    ``notify.receipts``."""
    found = {}
    for msg in read_topic(stack, stack.receipts_topic):
        doc = orjson.loads(msg.value())
        if doc.get("provider_id") == provider_id:
            found[doc["provider_event_id"]] = (doc, msg)
    return found


def sendgrid_key(stack: Settings) -> ec.EllipticCurvePrivateKey:
    pem = stack.sendgrid.event_webhook_signing_key
    assert pem is not None
    key = serialization.load_pem_private_key(pem.get_secret_value().encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def post_sendgrid(stack: Settings, api: str, events: Any, *,
                  key: ec.EllipticCurvePrivateKey | None = None, at: float | None = None,
                  sign: bool = True, body: bytes | None = None) -> httpx.Response:
    """Post a batch as SendGrid does (signed over timestamp + raw body, unless ``sign`` is
    false); ``body`` replaces the signed payload (tampering)."""
    payload = orjson.dumps(events) + b"\r\n"
    stamp = str(int(time.time() if at is None else at))
    headers = {"Content-Type": "application/json"}
    if sign:
        headers[EVENT_SIGNATURE_HEADER] = event_signature(key or sendgrid_key(stack), stamp,
                                                          payload)
        headers[EVENT_TIMESTAMP_HEADER] = stamp
    return httpx.post(f"{api}/webhooks/sendgrid", content=body or payload, headers=headers)


def sg_event(kind: str, sid: str, mid: str | None, attempt: int = 1,
             **extra: Any) -> dict[str, Any]:
    event = {"event": kind, "email": "ada@example.com", "timestamp": int(time.time()),
             "sg_event_id": f"evt-{uuid.uuid4().hex}",
             "sg_message_id": f"{sid}.filterdrecv-test-{secrets.token_hex(4)}-0.0",
             "smtp-id": f"<{sid}@test.sendgrid.net>", **extra}
    if mid is not None:
        event.update(message_id=mid, attempt=str(attempt))
    return event


def vonage_dlr(stack: Settings, sid: str, status: str, ref: str | None, *,
               secret: str | None = None, at: float | None = None,
               sign: bool = True, **extra: str) -> dict[str, str]:
    """Delivery-receipt parameters as the Vonage emulator sends them, signed with the
    configured signature secret (or ``secret``)."""
    params = {"msisdn": PHONE[1:], "to": "Notiflow", "network-code": "310260",
              "messageId": sid, "price": "0.03330000", "status": status, "scts": "2601011200",
              "err-code": "0" if status == "delivered" else "1",
              "api-key": stack.vonage.api_key or "",
              "message-timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), **extra}
    if ref is not None:
        params["client-ref"] = ref
    if sign:
        configured = stack.vonage.signature_secret
        assert configured is not None
        params["timestamp"] = str(int(time.time() if at is None else at))
        params["nonce"] = secrets.token_hex(8)
        params["sig"] = vonage_signature(secret or configured.get_secret_value(), params)
    return params


def post_dsn(stack: Settings, api: str, dsn: bytes, *, token: str | None = None,
             content_type: str = "message/rfc822", auth: bool = True) -> httpx.Response:
    secret = stack.smtp.dsn_webhook_secret
    assert secret is not None
    headers = {"Content-Type": content_type}
    if auth:
        headers["Authorization"] = f"Bearer {token or secret.get_secret_value()}"
    return httpx.post(f"{api}/webhooks/smtp-dsn", content=dsn, headers=headers)


def original_headers(mid: str, attempt: int, rcpt: str, *, ours: bool = True) -> bytes:
    lines = ["From: notifications@example.com", f"To: {rcpt}", "Subject: hello",
             f"Message-ID: <{mid}.{attempt}@notiflow>" if ours else
             f"Message-ID: <{uuid.uuid4().hex}@elsewhere.example>"]
    if ours:
        lines += [f"X-Notiflow-Message-Id: {mid}", f"X-Notiflow-Attempt: {attempt}"]
    return "\n".join(lines).encode() + b"\n"


def send(api: str, token: str, *, channel: str, tier: str, recipient: str, template: str,
         version: int, variables: dict[str, str], backlog_wait: float = 90.0) -> str:
    """Post a message as an upstream service would: a ``429 backlog`` (the tier's send flow
    still catching up, e.g. on what earlier tests queued before it started) is retried with
    the same idempotency key after its ``Retry-After``, for up to ``backlog_wait`` seconds."""
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex}
    body = {"channel": channel, "tier": tier, "recipient": recipient, "template_id": template,
            "template_version": version, "variables": variables}
    deadline = time.monotonic() + backlog_wait
    while True:
        r = httpx.post(f"{api}/v1/messages", headers=headers, json=body)
        if r.status_code != 429 or r.json().get("reason") != "backlog" or \
                time.monotonic() >= deadline:
            break
        hold(float(r.headers.get("Retry-After", "1")))
    assert r.status_code == 202, f"{r.text}; backlog reports: {backlog_reports(tier)}"
    return str(r.json()["message_id"])


def backlog_reports(tier: str) -> dict[str, str]:
    """What every send-flow worker last reported for ``tier`` (diagnostics of a 429)."""
    import redis

    from notiflow.adapters.backlog import backlog_key
    from notiflow.schemas.enums import Tier
    from notiflow.settings import load_settings

    s = load_settings()
    client = redis.Redis.from_url(s.redis_url, decode_responses=True)
    return client.hgetall(backlog_key(s.topic_prefix, Tier(tier)))


def receipt_events(cql: Session, mid: str, provider_id: str) -> list[dict[str, Any]]:
    return [r for r in cql.execute(
        "SELECT status, source, event_id FROM message_events WHERE message_id = %s", (mid,))
        if r["source"] == f"receipt.{provider_id}"]


def status_is(cql: Session, mid: str, *statuses: str) -> dict[str, Any] | None:
    row = message_row(cql, mid)
    return row if row is not None and row["status"] in statuses else None


@pytest.fixture(scope="module")
def email_template(api: str, tokens: dict[str, str]) -> int:
    """Version of the acme template ``order-mail`` (EMAIL, one variable ``order``)."""
    return create_template(api, tokens["acme"], template_id="order-mail", channel="EMAIL",
                           subject="Order {{ order }}", body="Order {{ order }} confirmed")


@pytest.fixture
def sendgrid_callbacks(fakes: str) -> Iterator[None]:
    """The SendGrid emulator posts its Event Webhook batches while the test runs."""
    before = httpx.get(f"{fakes}/_admin/sendgrid/config").json()
    r = httpx.post(f"{fakes}/_admin/sendgrid/config",
                   json={"callbacks_enabled": True, "callback_delay_ms": 20})
    assert r.status_code == 200, r.text
    try:
        yield
    finally:
        httpx.post(f"{fakes}/_admin/sendgrid/config", json={
            k: before[k] for k in ("callbacks_enabled", "callback_delay_ms")})


# SendGrid ------------------------------------------------------------------------------


def test_sendgrid_forged_unsigned_and_stale_batches_are_refused(stack: Settings,
                                                               api: str) -> None:
    events = [sg_event("delivered", uuid.uuid4().hex[:22], f"msg_sgforged_{uuid.uuid4().hex}")]
    refused = {
        "unsigned": post_sendgrid(stack, api, events, sign=False),
        "other key": post_sendgrid(stack, api, events,
                                   key=ec.generate_private_key(ec.SECP256R1())),
        "tampered": post_sendgrid(stack, api, events, body=orjson.dumps(
            [{**events[0], "event": "click"}]) + b"\r\n"),
        "stale": post_sendgrid(stack, api, events, at=time.time() - 360),
        "future": post_sendgrid(stack, api, events, at=time.time() + 360),
    }
    reasons = {name: (r.status_code, r.json().get("reason")) for name, r in refused.items()}
    assert reasons == {"unsigned": (403, "missing_signature"),
                       "other key": (403, "invalid_signature"),
                       "tampered": (403, "invalid_signature"),
                       "stale": (403, "stale_timestamp"),
                       "future": (403, "stale_timestamp")}
    sentinel = [sg_event("delivered", uuid.uuid4().hex[:22], None)]
    assert post_sendgrid(stack, api, sentinel).status_code == 200
    on_topic = receipts_by_event(stack, "sendgrid")
    assert sentinel[0]["sg_event_id"] in on_topic
    assert events[0]["sg_event_id"] not in on_topic


def test_sendgrid_batch_becomes_normalised_receipts(stack: Settings, api: str) -> None:
    mid, sid = f"msg_sgbatch_{uuid.uuid4().hex}", uuid.uuid4().hex[:22]
    kinds = {
        "delivered": sg_event("delivered", sid, mid, response="250 OK"),
        "bounce": sg_event("bounce", sid, mid, 2, type="bounce", status="5.1.1",
                           reason="550 5.1.1 unknown user"),
        "blocked": sg_event("bounce", sid, mid, type="blocked", status="5.7.1"),
        "dropped": sg_event("dropped", sid, mid, reason="Bounced Address"),
        "open": sg_event("open", sid, mid),
        "click": sg_event("click", sid, mid, url="https://example.com/x"),
        "spamreport": sg_event("spamreport", sid, mid),
        "processed": sg_event("processed", sid, mid),
        "deferred": sg_event("deferred", sid, mid, attempt_count="2"),
        "unknown": sg_event("machine_opened", sid, mid),
        "no_event_id": {**sg_event("delivered", sid, mid), "sg_event_id": None},
        "bad_bounce": sg_event("bounce", sid, mid, type="sideways"),
    }
    batch = [*kinds.values(), 42]
    r = post_sendgrid(stack, api, batch)
    assert r.status_code == 200, r.text
    assert r.json() == {"receipts": 7, "malformed": 3, "ignored": 3}
    on_topic = receipts_by_event(stack, "sendgrid")
    expected = {"delivered": ("DELIVERED", "delivered", None),
                "bounce": ("BOUNCED", "bounce", "5.1.1"),
                "blocked": ("FAILED", "blocked", "5.7.1"),
                "dropped": ("FAILED", "dropped", "Bounced Address"),
                "open": ("OPENED", "open", None),
                "click": ("CLICKED", "click", None),
                "spamreport": ("DELIVERED", "spamreport", None)}
    for name, (status, raw_status, error_code) in expected.items():
        event = kinds[name]
        doc, msg = on_topic[event["sg_event_id"]]
        assert (doc["status"], doc.get("raw_status"), doc.get("error_code")) == (
            status, raw_status, error_code), name
        assert doc["provider_message_id"] == sid
        assert doc["message_id"] == mid
        assert doc["attempt"] == (2 if name == "bounce" else 1)
        assert doc["occurred_at"].startswith(time.strftime(
            "%Y-%m-%dT%H:%M", time.gmtime(event["timestamp"])))
        assert msg.key() == sid.encode()
        assert header(msg.headers(), "message_id") == mid
    for name in ("processed", "deferred", "unknown", "bad_bounce"):
        assert kinds[name]["sg_event_id"] not in on_topic, name
    assert post_sendgrid(stack, api, {"not": "a batch"}).status_code == 400


def test_p1_email_through_sendgrid_ends_delivered(
        api: str, tokens: dict[str, str], email_template: int, sendgrid_callbacks: None,
        send_p1: ManagedProcess, cql: Session) -> None:
    mid = send(api, tokens["acme"], channel="EMAIL", tier="P1", recipient="ada@example.com",
               template="order-mail", version=email_template, variables={"order": "A-1"})
    wait_for(lambda: status_is(cql, mid, "DELIVERED"), timeout=90,
             what="DELIVERED from SendGrid's Event Webhook")
    view = httpx.get(f"{api}/v1/messages/{mid}",
                     headers={"Authorization": f"Bearer {tokens['acme']}"}).json()
    assert view["attempts"][0]["provider_id"] == "sendgrid"
    assert {r["status"] for r in receipt_events(cql, mid, "sendgrid")} == {"DELIVERED"}


def test_sendgrid_duplicated_and_shuffled_events_never_regress(
        stack: Settings, api: str, tokens: dict[str, str], email_template: int,
        send_p1: ManagedProcess, cql: Session) -> None:
    mid = send(api, tokens["acme"], channel="EMAIL", tier="P1", recipient="ada@example.com",
               template="order-mail", version=email_template, variables={"order": "B-2"})
    row = wait_for(lambda: (lambda r: r if r and r["provider_message_id"] else None)(
        message_row(cql, mid)), timeout=90, what="SendGrid's X-Message-Id")
    sid = row["provider_message_id"]
    events = [sg_event(kind, sid, mid) for kind in
              ("processed", "delivered", "open", "click", "deferred", "open")]
    posts = [*events, *events[1:3]]
    random.Random(5).shuffle(posts)
    for i in range(0, len(posts), 3):
        assert post_sendgrid(stack, api, posts[i:i + 3]).status_code == 200
    wait_for(lambda: status_is(cql, mid, "CLICKED"), what="CLICKED")
    late = sg_event("delivered", sid, mid)
    assert post_sendgrid(stack, api, [events[1], late]).status_code == 200
    seen = wait_for(lambda: (lambda rows: rows if f"sendgrid:{late['sg_event_id']}" in {
        r["event_id"] for r in rows} else None)(receipt_events(cql, mid, "sendgrid")),
        what="the late delivered receipt recorded")
    assert message_row(cql, mid)["status"] == "CLICKED"
    assert len(seen) == len({r["event_id"] for r in seen}) == 5


# Vonage --------------------------------------------------------------------------------


def test_vonage_receipts_signed_forged_missing_and_stale(stack: Settings, api: str) -> None:
    mid = f"msg_vonage_{uuid.uuid4().hex}"
    url = f"{api}/webhooks/vonage"
    good = {name: (str(uuid.uuid4()), name) for name in ("form", "get", "json")}
    assert httpx.post(url, data=vonage_dlr(stack, good["form"][0], "delivered",
                                           f"{mid}:2")).status_code == 200
    assert httpx.get(url, params=vonage_dlr(stack, good["get"][0], "accepted",
                                            f"{mid}:2")).status_code == 200
    assert httpx.post(url, json=vonage_dlr(stack, good["json"][0], "expired",
                                           f"{mid}:2")).status_code == 200

    bad_sid = str(uuid.uuid4())
    tampered = vonage_dlr(stack, bad_sid, "failed", f"{mid}:2")
    refused = {
        "forged": httpx.post(url, data=vonage_dlr(stack, bad_sid, "delivered", f"{mid}:2",
                                                  secret="not-the-secret")),
        "unsigned": httpx.post(url, data=vonage_dlr(stack, bad_sid, "delivered", f"{mid}:2",
                                                    sign=False)),
        "stale": httpx.post(url, data=vonage_dlr(stack, bad_sid, "delivered", f"{mid}:2",
                                                 at=time.time() - 360)),
        "tampered": httpx.post(url, data={**tampered, "status": "delivered"}),
        "other account": httpx.get(url, params=vonage_dlr(stack, bad_sid, "delivered",
                                                          f"{mid}:2", **{"api-key": "abc"})),
    }
    reasons = {name: (r.status_code, r.json().get("reason")) for name, r in refused.items()}
    assert reasons == {"forged": (403, "invalid_signature"),
                       "unsigned": (403, "missing_signature"),
                       "stale": (403, "stale_timestamp"),
                       "tampered": (403, "invalid_signature"),
                       "other account": (403, "wrong_account")}
    unknown = httpx.post(url, data=vonage_dlr(stack, bad_sid, "unknown", f"{mid}:2"))
    assert (unknown.status_code, unknown.json()) == (200, {"receipts": 0})
    assert httpx.post(url, data=vonage_dlr(stack, bad_sid, "lost", f"{mid}:2")
                      ).status_code == 400

    on_topic = receipts_by_event(stack, "vonage")
    assert not [k for k in on_topic if k.startswith(bad_sid)]
    expected = {"form": ("DELIVERED", "delivered", None), "get": ("SENT", "accepted", "1"),
                "json": ("FAILED", "expired", "1")}
    for name, (status, raw_status, error_code) in expected.items():
        sid = good[name][0]
        doc, msg = on_topic[f"{sid}:{raw_status}"]
        assert (doc["status"], doc["raw_status"], doc.get("error_code")) == (
            status, raw_status, error_code), name
        assert (doc["provider_message_id"], doc["message_id"], doc["attempt"]) == (sid, mid, 2)
        assert msg.key() == sid.encode()


def test_p3_sms_through_vonage_ends_delivered_and_never_regresses(
        stack: Settings, api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p3: ManagedProcess, cql: Session) -> None:
    mid = send(api, tokens["acme"], channel="SMS", tier="P3", recipient=PHONE,
               template="otp", version=otp_template["acme"], variables={"code": "135790"})
    row = wait_for(lambda: status_is(cql, mid, "DELIVERED"), timeout=90,
                   what="DELIVERED from Vonage's delivery receipt")
    assert row["provider_id"] == "vonage"
    sid = row["provider_message_id"]
    ref = f"{mid}:1"
    dlrs = [vonage_dlr(stack, sid, st, ref) for st in
            ("failed", "accepted", "delivered", "buffered", "rejected", "expired", "delivered",
             "unknown")]
    random.Random(7).shuffle(dlrs)
    for params in dlrs:
        assert httpx.post(f"{api}/webhooks/vonage", data=params).status_code == 200
    expected = {f"vonage:{sid}:{st}" for st in (
        "failed", "accepted", "delivered", "buffered", "rejected", "expired")}
    seen = wait_for(lambda: (lambda rows: rows if {r["event_id"] for r in rows} == expected
                             else None)(receipt_events(cql, mid, "vonage")),
                    what="every distinct receipt recorded once")
    assert len(seen) == len(expected)
    assert message_row(cql, mid)["status"] == "DELIVERED"


# SMTP DSNs -----------------------------------------------------------------------------


def test_smtp_dsn_auth_parsing_and_mapping(stack: Settings, api: str) -> None:
    """DSNs are correlated only by the tagged bounce address they were sent to; one that
    quotes a message's headers, ENVID and queue id but not its bounce address is refused."""
    mid, rcpt = f"msg_dsn_{uuid.uuid4().hex}", "kim@dsn-bounce.example.com"
    keys = CorrelationKeys.from_settings(stack)
    attempts = {"hard": 3, "soft": 4, "delayed": 5, "envelope": 6, "forged": 7, "bodyonly": 8}

    def dsn(name: str, **kw: Any) -> bytes:
        n = attempts[name]
        defaults: dict[str, Any] = {
            "sender": bounce_address(keys, stack.smtp.from_email, mid, n), "rcpt": rcpt,
            "original_headers": original_headers(mid, n, rcpt),
            "queue_id": secrets.token_hex(6).upper(), "envid": f"{mid}.{n}",
            "diagnostic": "smtp; 550 5.1.1 unknown user"}
        return build_dsn(**{**defaults, **kw})

    forged = dsn("forged", sender=stack.smtp.from_email)
    assert post_dsn(stack, api, forged, auth=False).status_code == 401
    wrong = post_dsn(stack, api, forged, token="not-the-secret")
    assert (wrong.status_code, wrong.json()["reason"]) == (403, "invalid_token")
    untagged = post_dsn(stack, api, forged)
    assert (untagged.status_code, untagged.json()["reason"]) == (422, "uncorrelated_dsn")

    hard = post_dsn(stack, api, dsn("hard"))
    assert (hard.status_code, hard.json()) == (200, {"receipts": 1, "ignored": 0})
    soft = post_dsn(stack, api, dsn("soft", status="5.2.2"))
    assert soft.json() == {"receipts": 1, "ignored": 0}
    delayed = post_dsn(stack, api, dsn("delayed", action="delayed", status="4.4.1"))
    assert delayed.json() == {"receipts": 0, "ignored": 1}
    by_envelope = httpx.post(
        f"{api}/webhooks/smtp-dsn", content=dsn("envelope", sender=stack.smtp.from_email),
        headers={"Authorization": f"Bearer {dsn_secret(stack)}",
                 "Content-Type": "message/rfc822",
                 "X-Envelope-To": bounce_address(keys, stack.smtp.from_email, mid, 6)})
    assert by_envelope.json() == {"receipts": 1, "ignored": 0}
    head, _, body = dsn("bodyonly").partition(b"\r\n\r\n")
    content_type = next(line.split(": ", 1)[1] for line in head.decode().split("\r\n")
                        if line.startswith("Content-Type:"))
    bodyonly = httpx.post(f"{api}/webhooks/smtp-dsn", content=body,
                          headers={"Authorization": f"Bearer {dsn_secret(stack)}",
                                   "Content-Type": content_type,
                                   "X-Envelope-To": bounce_address(
                                       keys, stack.smtp.from_email, mid, 8)})
    assert bodyonly.json()["receipts"] == 1

    not_dsn = post_dsn(stack, api, b"From: a@example.com\r\nSubject: hi\r\n\r\nhello\r\n")
    assert (not_dsn.status_code, not_dsn.json()["reason"]) == (422, "not_a_dsn")

    on_topic = {doc["provider_message_id"]: doc
                for doc, _ in receipts_by_event(stack, "smtp").values()}
    for name in ("forged", "delayed"):
        assert f"{mid}.{attempts[name]}@notiflow" not in on_topic
    expected = {"hard": ("BOUNCED", "5.1.1"), "soft": ("FAILED", "5.2.2"),
                "envelope": ("BOUNCED", "5.1.1"), "bodyonly": ("BOUNCED", "5.1.1")}
    for name, (status, code) in expected.items():
        sent_as = f"{mid}.{attempts[name]}@notiflow"
        doc = on_topic[sent_as]
        assert (doc["status"], doc["error_code"], doc["raw_status"]) == (status, code, "failed")
        assert (doc["message_id"], doc["attempt"]) == (mid, attempts[name])
        assert doc["provider_event_id"] == f"dsn:{sent_as}:0:failed:{code}"


def dsn_secret(stack: Settings) -> str:
    secret = stack.smtp.dsn_webhook_secret
    assert secret is not None
    return secret.get_secret_value()


def test_p3_email_hard_bounce_dsn_ends_bounced(
        stack: Settings, api: str, tokens: dict[str, str], email_template: int,
        send_p3: ManagedProcess, cql: Session, fakes: str) -> None:
    mid = send(api, tokens["acme"], channel="EMAIL", tier="P3",
               recipient="kim@dsn-bounce.example.com", template="order-mail",
               version=email_template, variables={"order": "C-3"})
    row = wait_for(lambda: status_is(cql, mid, "BOUNCED"), timeout=90,
                   what="BOUNCED from the relay's DSN")
    assert row["provider_id"] == "smtp" and row["reason"] == "5.1.1"
    [record] = [r for r in httpx.get(f"{fakes}/_admin/smtp/messages",
                                     params={"message_id": mid}).json()
                if r["outcome"] == "accepted"]
    assert row["provider_message_id"] == record["sid"]
    assert [r["status"] for r in receipt_events(cql, mid, "smtp")] == ["BOUNCED"]
