"""SES events through SNS, the pure parts and the certificate cache: the signature against a
third-party validator (PyPI's ``aws-sns-message-validator``), the URL and topic checks, the
SES event → receipt table, and :class:`SnsCertificates` over a mocked transport."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from sns_message_validator import SignatureVerificationFailureException, SNSMessageValidator

from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.flows.receipts.reconcile import suppression_for
from notiflow.providers.ses import receipts, sns
from notiflow.providers.ses.config import SesSettings
from notiflow.providers.ses.sns_emulator import self_signed
from notiflow.providers.ses.sns_http import SnsCertificates, SnsUnreachable
from notiflow.schemas.enums import Status
from tests.fakes import ManualClock
from tests.helpers import loop_turns

TOPIC = "arn:aws:sns:us-east-1:123456789012:ses-events"
CERT_URL = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-abc.pem"
AWS_HOSTS = SesSettings().sns_host_pattern
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = self_signed(KEY)
NOW = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)


def signed(kind: str = sns.NOTIFICATION, version: str = "1", key: rsa.RSAPrivateKey = KEY,
           **fields: str) -> dict[str, str]:
    doc = {"Type": kind, "MessageId": "5f2a6d1e-0000-4000-8000-000000000001",
           "TopicArn": TOPIC, "Timestamp": "2026-12-06T08:00:00.000Z",
           "Message": '{"eventType":"Delivery"}', "SigningCertURL": CERT_URL, **fields}
    if kind != sns.NOTIFICATION:
        doc.setdefault("Token", "t0k3n")
        doc.setdefault("SubscribeURL", "https://sns.us-east-1.amazonaws.com/?Action="
                                       f"ConfirmSubscription&TopicArn={TOPIC}&Token=t0k3n")
    return {**doc, "SignatureVersion": version, "Signature": sns.sign(doc, key, version)}


def oracle(doc: dict[str, Any]) -> None:
    """The third-party validator, its certificate fetch answered with our PEM."""
    validator = SNSMessageValidator()
    validator._cert_session = SimpleNamespace(get=lambda _url: SimpleNamespace(content=PEM))
    validator.validate_message(doc)


def ours(doc: dict[str, Any]) -> None:
    sns.verify(sns.parse_envelope(doc), KEY.public_key(), sha1=True)


@pytest.mark.parametrize("kind", [sns.NOTIFICATION, sns.SUBSCRIPTION_CONFIRMATION,
                                  sns.UNSUBSCRIBE_CONFIRMATION])
@pytest.mark.parametrize("subject", [None, "Amazon SES Email Event Notification"])
def test_the_validator_and_ours_accept_what_sns_signs(kind: str, subject: str | None) -> None:
    doc = signed(kind, **({"Subject": subject} if subject else {}))
    oracle(doc)
    ours(doc)


@pytest.mark.parametrize("field,value", [("Message", '{"eventType":"Bounce"}'),
                                         ("TopicArn", TOPIC + "x"), ("MessageId", "other"),
                                         ("Timestamp", "2026-12-06T08:00:01.000Z"),
                                         ("Subject", "added")])
def test_both_refuse_a_tampered_field(field: str, value: str) -> None:
    doc = {**signed(), field: value}
    with pytest.raises(SignatureVerificationFailureException):
        oracle(doc)
    with pytest.raises(WebhookRefused, match="does not verify"):
        ours(doc)


def test_version_2_is_sha256_and_a_version_swap_fails() -> None:
    doc = signed(version="2")
    ours(doc)
    for swapped in ({**doc, "SignatureVersion": "1"}, {**signed(), "SignatureVersion": "2"}):
        with pytest.raises(WebhookRefused):
            ours(swapped)
    with pytest.raises(WebhookRefused, match="unsupported"):
        ours({**doc, "SignatureVersion": "3"})


def test_another_key_and_garbage_signatures_are_refused() -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for doc in (signed(key=other), {**signed(), "Signature": "not base64!"},
                {**signed(), "Signature": ""}):
        with pytest.raises(WebhookRefused, match="does not verify"):
            ours(doc)


@pytest.mark.parametrize("doc,problem", [
    ([], "not a JSON object"), ({"Type": "Other"}, "unknown"), ({"Type": {}}, "unknown"),
    ({**signed(), "Signature": None}, "Signature"),
    ({k: v for k, v in signed(sns.SUBSCRIPTION_CONFIRMATION).items() if k != "Token"}, "Token"),
])
def test_what_is_not_an_sns_message(doc: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        sns.parse_envelope(doc)


@pytest.mark.parametrize("url", [
    CERT_URL, "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-x.pem",
    "https://sns.eu-west-3.amazonaws.com:443/a/b.pem"])
def test_certificates_from_sns_hosts_are_trusted(url: str) -> None:
    sns.check_url(url, AWS_HOSTS, pem=True)


@pytest.mark.parametrize("url", [
    "http://sns.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com.evil.example/x.pem",
    "https://evil.example/sns.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com@evil.example/x.pem",
    "https://user@sns.us-east-1.amazonaws.com/x.pem",
    "https://sqs.us-east-1.amazonaws.com/x.pem",
    "https://sns.us-east-1.amazonaws.com/x.txt",
    "https://sns.us-east-1.amazonaws.com:99999/x.pem",
    "file:///etc/passwd.pem", "not a url"])
def test_anything_else_is_refused(url: str) -> None:
    with pytest.raises(WebhookRefused) as refused:
        sns.check_url(url, AWS_HOSTS, pem=True)
    assert refused.value.reason == "untrusted_url"


def test_http_only_where_configured() -> None:
    sns.check_url("http://127.0.0.1:18090/ses/sns/x.pem", r"127\.0\.0\.1", require_https=False,
                  pem=True)
    with pytest.raises(WebhookRefused):
        sns.check_url("http://127.0.0.1:18090/ses/sns/x.pem", r"127\.0\.0\.1", pem=True)


def test_subscribe_url_must_confirm_this_topic() -> None:
    msg = sns.parse_envelope(signed(sns.SUBSCRIPTION_CONFIRMATION))
    assert sns.check_subscribe_url(msg, AWS_HOSTS).startswith("https://sns.us-east-1")
    for url in (f"https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe&TopicArn={TOPIC}",
                "https://sns.us-east-1.amazonaws.com/?Action=ConfirmSubscription&TopicArn=x",
                f"https://evil.example/?Action=ConfirmSubscription&TopicArn={TOPIC}"):
        other = sns.parse_envelope(signed(sns.SUBSCRIPTION_CONFIRMATION, SubscribeURL=url))
        with pytest.raises(WebhookRefused) as refused:
            sns.check_subscribe_url(other, AWS_HOSTS)
        assert refused.value.reason == "untrusted_url"


def test_only_configured_topics() -> None:
    msg = sns.parse_envelope(signed())
    sns.check_topic(msg, (TOPIC,))
    with pytest.raises(WebhookRefused) as none:
        sns.check_topic(msg, ())
    assert none.value.reason == "webhook_not_configured"
    with pytest.raises(WebhookRefused) as other:
        sns.check_topic(msg, ("arn:aws:sns:us-east-1:123456789012:other",))
    assert other.value.reason == "wrong_account"


# SES events → receipts -----------------------------------------------------------------------

MAIL = {"timestamp": "2026-12-06T07:59:59.000Z", "messageId": "0100abc-def-000000",
        "destination": ["ada@example.com"],
        "tags": {"message_id": ["msg_0a1b"], "attempt": ["2"],
                 "traceparent": ["00-" + "a" * 32 + "-" + "b" * 16 + "-01"]}}


def event(kind: str, detail_key: str | None = None, identity: bool = False,
          **detail: Any) -> str:
    mail = copy.deepcopy(MAIL)
    if identity:
        del mail["tags"]
    doc: dict[str, Any] = {("notificationType" if identity else "eventType"): kind,
                           "mail": mail}
    if detail_key:
        doc[detail_key] = {"timestamp": "2026-12-06T08:00:01.500Z", **detail}
    return orjson.dumps(doc).decode()


def receipt_of(message: str) -> Any:
    return receipts.event_receipt(receipts.decode(message), "ses", "sns-msg-1", NOW)


@pytest.mark.parametrize("message,status,raw,code", [
    (event("Delivery", "delivery"), Status.DELIVERED, "delivery", None),
    (event("Bounce", "bounce", bounceType="Permanent", bounceSubType="General",
           bouncedRecipients=[{"emailAddress": "ada@example.com", "status": "5.1.1"}]),
     Status.BOUNCED, "bounce", "5.1.1"),
    (event("Bounce", "bounce", bounceType="Transient", bounceSubType="MailboxFull",
           bouncedRecipients=[{"emailAddress": "ada@example.com"}]),
     Status.FAILED, "transient", "MailboxFull"),
    (event("Bounce", "bounce", bounceType="Undetermined"), Status.FAILED, "undetermined", None),
    (event("Complaint", "complaint", complaintFeedbackType="abuse"), Status.DELIVERED,
     "complaint", "abuse"),
    (event("Reject", "reject", reason="Bad content"), Status.FAILED, "reject", "Bad content"),
    (event("Rendering Failure", "failure", errorMessage="Attribute 'name' is not present"),
     Status.FAILED, "rendering_failure", "Attribute 'name' is not present"),
    (event("Open", "open"), Status.OPENED, "open", None),
    (event("Click", "click", link="https://example.com"), Status.CLICKED, "click", None),
])
def test_event_table(message: str, status: Status, raw: str, code: str | None) -> None:
    r = receipt_of(message)
    assert (r.status, r.raw_status, r.error_code) == (status, raw, code)
    assert (r.provider_id, r.provider_event_id, r.provider_message_id) == (
        "ses", "sns-msg-1", "0100abc-def-000000")
    assert (r.message_id, r.attempt) == ("msg_0a1b", 2)
    assert r.occurred_at == datetime(2026, 12, 6, 8, 0, 1, 500000, tzinfo=UTC)


def test_what_the_reconciler_suppresses() -> None:
    bounce = receipt_of(event("Bounce", "bounce", bounceType="Permanent"))
    complaint = receipt_of(event("Complaint", "complaint"))
    transient = receipt_of(event("Bounce", "bounce", bounceType="Transient"))
    assert suppression_for(bounce) == "hard_bounce"
    assert suppression_for(complaint) == "complaint"
    assert suppression_for(transient) is None
    assert suppression_for(receipt_of(event("Delivery", "delivery"))) is None


@pytest.mark.parametrize("kind", ["Send", "DeliveryDelay", "Subscription", "Unknown"])
def test_events_without_news(kind: str) -> None:
    assert receipt_of(event(kind)) is None


def test_identity_notifications_correlate_by_ses_message_id() -> None:
    r = receipt_of(event("Delivery", "delivery", identity=True))
    assert (r.message_id, r.attempt, r.provider_message_id) == (None, None, "0100abc-def-000000")
    assert receipts.decode(event("Delivery", identity=True)).traceparent is None
    assert r.status is Status.DELIVERED


def test_time_falls_back_to_the_mail_then_now() -> None:
    assert receipt_of(event("Delivery")).occurred_at == datetime(2026, 12, 6, 7, 59, 59,
                                                                 tzinfo=UTC)
    doc = orjson.loads(event("Delivery"))
    del doc["mail"]["timestamp"]
    assert receipt_of(orjson.dumps(doc).decode()).occurred_at == NOW


@pytest.mark.parametrize("message,problem", [
    ("not json", "not JSON"), ("[1]", "not a JSON object"), ('{"mail": {}}', "eventType"),
    ('{"eventType": "Delivery", "mail": {}}', "messageId"),
    (event("Bounce", "bounce", bounceType="Sideways"), "bounceType"),
])
def test_malformed_events(message: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        receipt_of(message)


# the certificate cache -----------------------------------------------------------------------


def certs(handler: Any, clock: ManualClock[float] | None = None) -> SnsCertificates:
    return SnsCertificates(httpx.AsyncClient(transport=httpx.MockTransport(handler)), ttl=60,
                           clock=clock or ManualClock(0.0))


def test_certificates_are_fetched_once_per_ttl() -> None:
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        await loop_turns(3)
        return httpx.Response(200, content=PEM)

    clock = ManualClock(0.0)

    async def run() -> None:
        cache = certs(handler, clock)
        keys = await asyncio.gather(*(cache.public_key(CERT_URL) for _ in range(20)))
        assert len(seen) == 1
        assert all(k.public_numbers() == KEY.public_key().public_numbers() for k in keys)
        clock.now = 59
        await cache.public_key(CERT_URL)
        assert len(seen) == 1
        clock.now = 61
        await cache.public_key(CERT_URL)
        assert len(seen) == 2
        await cache.aclose()

    asyncio.run(run())


def test_unreachable_and_unusable_certificates() -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    answers = {"/404.pem": httpx.Response(404), "/junk.pem": httpx.Response(200, content=b"x"),
               "/ec.pem": httpx.Response(200, content=_ec_cert(ec_key))}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/down.pem":
            raise httpx.ConnectError("refused")
        return answers[request.url.path]

    async def run() -> None:
        cache = certs(handler)
        for path in ("/404.pem", "/down.pem"):
            with pytest.raises(SnsUnreachable):
                await cache.public_key(f"https://sns.us-east-1.amazonaws.com{path}")
        for path in ("/junk.pem", "/ec.pem"):
            with pytest.raises(WebhookRefused):
                await cache.public_key(f"https://sns.us-east-1.amazonaws.com{path}")
        await cache.aclose()

    asyncio.run(run())


def _ec_cert(key: ec.EllipticCurvePrivateKey) -> bytes:
    from datetime import timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "not-sns")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(NOW - timedelta(days=1)).not_valid_after(NOW + timedelta(days=1))
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)
