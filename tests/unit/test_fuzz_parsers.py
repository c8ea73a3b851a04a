"""Fuzzing every parser of untrusted input with hypothesis (``make fuzz``: 10,000 inputs each; the
test command runs 1,000): ingest records (the send flow's parser) and the reconciler's events
and receipts, each provider's webhook bodies and signature headers, SMTP DSNs, bearer tokens,
campaign manifests (read in chunks split anywhere, then mapped to messages). No input raises
anything but the rejection the caller turns into a 4xx (``ValueError``, ``ValidationError``,
``WebhookRefused``) or a row rejection with a reason, and every ingest rejection is a dead
letter with a reason."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from datetime import UTC, datetime, time, timedelta
from typing import Any

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.envelope import dump, envelope, new_key
from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.correlation import CorrelationKeys
from notiflow.flows.campaigns.manifest import (
    CampaignSpec,
    ManifestError,
    Mapped,
    Rejected,
    RowReader,
    map_row,
)
from notiflow.flows.common.items import Work
from notiflow.flows.common.steps import IngestParser, parse_reconcile
from notiflow.providers.sendgrid import receipts as sendgrid_receipts
from notiflow.providers.sendgrid import signature as sendgrid_signature
from notiflow.providers.sendgrid.config import SendGridSettings
from notiflow.providers.ses import receipts as ses_receipts
from notiflow.providers.ses import sns
from notiflow.providers.smtp import receipts as smtp_receipts
from notiflow.providers.smtp import signature as smtp_signature
from notiflow.providers.smtp.emulator import build_dsn
from notiflow.providers.twilio import receipts as twilio_receipts
from notiflow.providers.twilio import signature as twilio_signature
from notiflow.providers.twilio.config import TwilioSettings
from notiflow.providers.vonage import receipts as vonage_receipts
from notiflow.providers.vonage import signature as vonage_signature
from notiflow.providers.vonage.config import VonageSettings
from notiflow.schemas.campaigns import ColumnMapping, LocalWindow
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord, Receipt, StatusEvent
from notiflow.settings import IngestBinding, IngestEncryption, Settings

EXAMPLES = int(os.environ.get("NOTIFLOW_FUZZ_EXAMPLES", "500"))
"""Inputs per parser: 500 in the test command, 10,000 or more with ``make fuzz``."""
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
KEY = Fernet.generate_key()
CIPHER = DlqCipher(KEY)
CONF = Settings(dlq_key=KEY.decode(), tenants=json.loads(
    '[{"id": "acme", "token": "t-acme-0123456789abcdef0123456789", "senders": ["ACME"]}, '
    '{"id": "mkt", "token": "t-mkt-0123456789abcdef0123456789ab", "tiers": ["P3"]}]'),
    topic_prefix="", twilio=TwilioSettings(auth_token=SecretStr("secret")),
    ingest_binding=IngestBinding(required=False))
PARSER = IngestParser(CONF, Tier.P1, CIPHER, lambda: NOW)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
VALID_INGEST: dict[str, Any] = {
    "channel": "SMS", "tier": "P1", "recipient": "+14155552671", "template_id": "otp",
    "template_version": 1, "tenant_id": "acme", "variables": {"code": "123456"},
    "category": "account", "expires_at": "2026-03-02T12:00:00Z", "ordering_key": "k",
    "scheduled_at": "2026-03-01T12:00:05Z", "schema_version": 1, "sender": "ACME"}
TEXT = st.text(max_size=40)


def mutated(valid: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``valid`` with some fields dropped and some replaced by arbitrary JSON or text."""
    return st.fixed_dictionaries({}, optional={
        k: st.one_of(st.just(v), JSON, TEXT) for k, v in valid.items()})


INGEST_BYTES = st.one_of(
    st.binary(max_size=200),
    JSON.map(orjson.dumps),
    mutated(VALID_INGEST).map(orjson.dumps),
    mutated(VALID_INGEST).map(lambda d: orjson.dumps(d)[:-3]),
)
HEADERS = st.lists(st.tuples(st.sampled_from(["tenant_id", "producer", "tier", "message_id",
                                              "traceparent", "x"]),
                             st.none() | st.binary(max_size=20)), max_size=4)


def kmsg(value: bytes | None, headers: list[tuple[str, bytes | None]], topic: str,
         ) -> KafkaSourceMessage:
    return KafkaSourceMessage(key=None, value=value, topic=topic, headers=headers,
                              latency=None, offset=7, partition=1, timestamp=(1, 1_772_366_400_000))


@FUZZ
@given(value=st.none() | INGEST_BYTES, headers=HEADERS,
       topic=st.sampled_from(["ingest.sms.p1", "ingest.email.p1", "ingest.sms.p3"]))
def test_ingest_parser_never_raises_and_explains_each_refusal(
        value: bytes | None, headers: list[tuple[str, bytes | None]], topic: str) -> None:
    out = PARSER(kmsg(value, headers, topic))
    assert isinstance(out, Work | DlqRecord | StatusEvent)
    if isinstance(out, DlqRecord):
        assert out.reason and out.category
        assert CIPHER.decrypt(out.payload_encrypted) == (value or b"")


SEALING = CONF.model_copy(update={"ingest_encryption": IngestEncryption(
    keys=new_key("k1"))})
SEALED_PARSER = IngestParser(SEALING, Tier.P1, CIPHER, lambda: NOW)
SEALED_VALID = orjson.loads(dump(IngestRecord.model_validate(
    {k: v for k, v in VALID_INGEST.items() if k != "scheduled_at"}), envelope(SEALING)))


def sealed_variants(sealed: str) -> st.SearchStrategy[str]:
    """``sealed`` with one of its parts replaced, cut, or bits of it changed."""
    parts = sealed.split(".")
    return st.one_of(
        st.integers(0, 3).flatmap(lambda i: TEXT.map(
            lambda t: ".".join([*parts[:i], t, *parts[i + 1:]]))),
        st.integers(0, len(sealed)).map(lambda n: sealed[:n]),
        st.tuples(st.integers(0, len(sealed) - 1), st.sampled_from("AZaz09-_.=")).map(
            lambda c: sealed[:c[0]] + c[1] + sealed[c[0] + 1:]))


@FUZZ
@given(doc=mutated(SEALED_VALID), sealed=sealed_variants(SEALED_VALID["sealed"]) | JSON)
def test_sealed_records_never_raise_and_open_only_to_what_was_sealed(
        doc: dict[str, Any], sealed: Any) -> None:
    value = orjson.dumps({**doc, "sealed": sealed})
    out = SEALED_PARSER(kmsg(value, [], "ingest.sms.p1"))
    assert isinstance(out, Work | DlqRecord | StatusEvent)
    if isinstance(out, Work):
        assert out.record.recipient == VALID_INGEST["recipient"]
        assert out.record.variables == VALID_INGEST["variables"]


EVENT = {"event_id": "e1", "message_id": "msg_1", "tenant_id": "acme", "channel": "SMS",
         "tier": "P1", "status": "DELIVERED", "attempt": 1,
         "occurred_at": "2026-03-01T12:00:00Z", "source": "x"}


@FUZZ
@given(value=st.one_of(st.binary(max_size=200), JSON.map(orjson.dumps),
                       mutated(EVENT).map(orjson.dumps)),
       headers=HEADERS, topic=st.sampled_from(["notify.events", "notify.receipts"]))
def test_reconcile_parser_never_raises(value: bytes, headers: list[tuple[str, bytes | None]],
                                       topic: str) -> None:
    out = parse_reconcile(kmsg(value, headers, topic), CONF, CIPHER, lambda: NOW)
    assert isinstance(out, DlqRecord) or out is not None


TWILIO_KEYS = ["MessageSid", "SmsSid", "MessageStatus", "SmsStatus", "ErrorCode", "AccountSid",
               "To", "From", "RawDlrDoneDate", "ApiVersion"]
TWILIO_STATUS = ["queued", "sent", "delivered", "undelivered", "failed", "read", "accepted"]
PARAMS = st.dictionaries(st.sampled_from(TWILIO_KEYS) | TEXT,
                         st.sampled_from(TWILIO_STATUS) | TEXT, max_size=8)
QUERY = st.dictionaries(st.sampled_from(["message_id", "attempt", "traceparent"]) | TEXT,
                        TEXT, max_size=3)
TWILIO = TwilioSettings(auth_token=SecretStr("secret"))


@FUZZ
@given(params=PARAMS, query=QUERY, url=TEXT, header=st.none() | TEXT)
def test_twilio_callbacks(params: dict[str, str], query: dict[str, str], url: str,
                          header: str | None) -> None:
    with contextlib.suppress(WebhookRefused):
        twilio_signature.check_callback(TWILIO, url, params, header)
    try:
        receipt = twilio_receipts.callback_receipt(params, query, "twilio", NOW)
    except ValueError:
        return
    assert receipt is None or isinstance(receipt, Receipt)


SENDGRID_EVENT = {"event": "delivered", "sg_message_id": "abc.filter0001", "sg_event_id": "e1",
                  "timestamp": 1_772_366_400, "email": "kim@example.com",
                  "notiflow_message_id": "msg_1", "notiflow_attempt": "1", "reason": "x",
                  "type": "bounce", "status": "5.1.1"}
_SG_KEY = ec.generate_private_key(ec.SECP256R1())
SENDGRID = SendGridSettings(event_webhook_public_key=base64.b64encode(
    _SG_KEY.public_key().public_bytes(serialization.Encoding.DER,
                                      serialization.PublicFormat.SubjectPublicKeyInfo)).decode())
SG_HEADERS = st.dictionaries(
    st.sampled_from(["X-Twilio-Email-Event-Webhook-Signature",
                     "X-Twilio-Email-Event-Webhook-Timestamp"]) | TEXT,
    TEXT | st.binary(max_size=40).map(lambda b: base64.b64encode(b).decode()), max_size=3)


@FUZZ
@given(event=st.one_of(JSON, mutated(SENDGRID_EVENT)), headers=SG_HEADERS,
       body=st.binary(max_size=200))
def test_sendgrid_events_and_signatures(event: Any, headers: dict[str, str],
                                        body: bytes) -> None:
    with contextlib.suppress(WebhookRefused):
        sendgrid_signature.check_event_post(SENDGRID, timedelta(minutes=10), headers, body,
                                            NOW.timestamp())
    try:
        receipt = sendgrid_receipts.event_receipt(event, "sendgrid", NOW)
    except (ValueError, ValidationError):
        return
    assert receipt is None or isinstance(receipt, Receipt)


SNS_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
SES_EVENT: dict[str, Any] = {
    "eventType": "Bounce",
    "mail": {"timestamp": "2026-03-01T12:00:00.000Z", "messageId": "0100abc-000000",
             "tags": {"message_id": ["msg_1"], "attempt": ["1"]}},
    "bounce": {"bounceType": "Permanent", "timestamp": "2026-03-01T12:00:01.000Z",
               "bouncedRecipients": [{"status": "5.1.1"}]}}
SNS_DOC: dict[str, Any] = {
    "Type": "Notification", "MessageId": "m-1", "TopicArn": "arn:aws:sns:us-east-1:1:t",
    "Message": orjson.dumps(SES_EVENT).decode(), "Timestamp": "2026-03-01T12:00:00.000Z",
    "SigningCertURL": "https://sns.us-east-1.amazonaws.com/c.pem", "SignatureVersion": "2"}
SNS_DOC["Signature"] = sns.sign(SNS_DOC, SNS_KEY, "2")


@FUZZ
@given(doc=st.one_of(JSON, mutated(SNS_DOC)), event=st.one_of(JSON, mutated(SES_EVENT)),
       url=TEXT | st.sampled_from(["https://sns.us-east-1.amazonaws.com/c.pem",
                                   "https://sns.x.amazonaws.com@e/c.pem", "https://[::1/x"]))
def test_sns_messages_and_ses_events(doc: Any, event: Any, url: str) -> None:
    with contextlib.suppress(WebhookRefused):
        sns.check_url(url, r"sns\.[a-z0-9-]+\.amazonaws\.com", pem=True)
    try:
        msg = sns.parse_envelope(doc)
    except ValueError:
        msg = None
    if msg is not None:
        with contextlib.suppress(WebhookRefused):
            sns.check_topic(msg, ("arn:aws:sns:us-east-1:1:t",))
            sns.verify(msg, SNS_KEY.public_key())
    try:
        receipt = ses_receipts.event_receipt(ses_receipts.decode(orjson.dumps(event).decode()),
                                             "ses", "m-1", NOW)
    except (ValueError, ValidationError):
        return
    assert receipt is None or isinstance(receipt, Receipt)


VONAGE_KEYS = ["messageId", "status", "err-code", "msisdn", "to", "api-key", "scts",
               "message-timestamp", "sig", "timestamp", "nonce", "client-ref", "price"]
VONAGE_VALUES = ["delivered", "failed", "rejected", "expired", "accepted", "buffered", "0",
                 "1", "2601011200", "2026-03-01 12:00:00", "key"]
VONAGE = VonageSettings(api_key="key", signature_secret=SecretStr("secret"))


@FUZZ
@given(params=st.dictionaries(st.sampled_from(VONAGE_KEYS) | TEXT,
                              st.sampled_from(VONAGE_VALUES) | TEXT, max_size=10))
def test_vonage_receipts_and_signatures(params: dict[str, str]) -> None:
    with contextlib.suppress(WebhookRefused):
        vonage_signature.check_receipt(VONAGE, timedelta(minutes=10), params, NOW.timestamp())
    try:
        receipt = vonage_receipts.dlr_receipt(params, "vonage", NOW)
    except (ValueError, ValidationError):
        return
    assert receipt is None or isinstance(receipt, Receipt)


SEED_DSN = build_dsn(sender="n@example.com", rcpt="kim@example.com",
                     original_headers=b"Message-ID: <msg_1.3@notiflow>\nX-Notiflow-Message-Id: "
                                      b"msg_1\nX-Notiflow-Attempt: 3\n",
                     queue_id="ABC123", envid="msg_1.3", diagnostic="smtp; 550 5.1.1 no")
def edits_of(seed: bytes, cut: int = 40) -> st.SearchStrategy[bytes]:
    """``seed`` with up to six stretches cut out and arbitrary bytes put in their place."""
    changes = st.lists(st.tuples(st.integers(0, len(seed)), st.integers(0, cut),
                                 st.binary(max_size=12)), max_size=6)

    def apply(edits: list[tuple[int, int, bytes]]) -> bytes:
        raw = seed
        for at, drop, insert in edits:
            raw = raw[:at] + insert + raw[at + drop:]
        return raw

    return changes.map(apply)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=300), edits_of(SEED_DSN)),
       content_type=st.none() | st.sampled_from(
           ["multipart/report; report-type=delivery-status; boundary=x", "text/plain"]) | TEXT,
       authorization=st.none() | TEXT)
def test_smtp_dsns_and_bearer(raw: bytes, content_type: str | None,
                              authorization: str | None) -> None:
    with contextlib.suppress(WebhookRefused):
        smtp_signature.check_bearer(SecretStr("secret"), authorization)
    try:
        report = smtp_receipts.parse_dsn(raw, content_type)
    except ValueError:
        return
    for receipt in smtp_receipts.dsn_receipts(report, "smtp", NOW, ("msg_1", 3)):
        assert isinstance(receipt, Receipt)


def test_the_seeds_are_accepted() -> None:
    """The fuzzers start from inputs the parsers take, so mutations reach deep code."""
    assert isinstance(PARSER(kmsg(orjson.dumps({k: v for k, v in VALID_INGEST.items()
                                                if k not in ("scheduled_at",)}), [],
                                  "ingest.sms.p1")), Work)
    assert smtp_receipts.dsn_receipts(smtp_receipts.parse_dsn(SEED_DSN), "smtp", NOW,
                                      ("msg_1", 3))
    assert sendgrid_receipts.event_receipt(SENDGRID_EVENT, "sendgrid", NOW) is not None
    sns.verify(sns.parse_envelope(SNS_DOC), SNS_KEY.public_key())
    assert ses_receipts.event_receipt(ses_receipts.decode(SNS_DOC["Message"]), "ses", "m-1",
                                      NOW) is not None


@pytest.mark.parametrize("status", TWILIO_STATUS)
def test_twilio_seed_statuses_parse(status: str) -> None:
    params = {"MessageSid": "SM1", "MessageStatus": status}
    try:
        twilio_receipts.callback_receipt(params, {"message_id": "msg_1", "attempt": "1"},
                                         "twilio", NOW)
    except ValueError:
        pytest.fail(f"{status} refused")


@FUZZ
@given(token=st.text(max_size=40))
def test_bearer_tokens_of_any_text_are_found_or_refused(token: str) -> None:
    """The API's authentication compares tokens as bytes: non-ASCII is a wrong token."""
    tenant = CONF.tenant_by_token(token)
    assert tenant is None or tenant.token.get_secret_value() == token


MANIFEST_SPEC = CampaignSpec(
    "mkt", "cmp_" + "c" * 32, Channel.SMS, Tier.P3, Category.MARKETING, "promo", 2,
    ColumnMapping.model_validate({"recipient": "to", "variables": {"name": "n"},
                                  "timezone": "tz"}),
    NOW + timedelta(days=3), "Europe/Berlin", LocalWindow(start=time(10), end=time(20)))
CSV_SEED = b'to,n,tz\n+14155552671,Ana,America/New_York\n"+4930123456",Bo,Europe/Berlin\n'
JSONL_SEED = b'{"to": "+14155552671", "n": "Ana", "tz": "Asia/Tokyo"}\n{"to": 1, "n": null}\n'


def manifest_bytes(seed: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=300), edits_of(seed, cut=20))


@FUZZ
@given(data=st.data(), fmt=st.sampled_from(["csv", "jsonl"]),
       cuts=st.lists(st.integers(0, 400), max_size=4))
def test_campaign_manifests_read_and_map_any_bytes(data: st.DataObject, fmt: str,
                                                   cuts: list[int]) -> None:
    raw = data.draw(manifest_bytes(CSV_SEED if fmt == "csv" else JSONL_SEED))
    reader = RowReader(fmt, max_row_bytes=120)  # type: ignore[arg-type]
    rows = []
    start = 0
    try:
        for cut in sorted(c for c in cuts if c <= len(raw)):
            rows += reader.feed(raw[start:cut])
            start = cut
        rows += reader.feed(raw[start:])
        rows += reader.finish()
    except ManifestError as exc:  # the whole manifest refused: the campaign fails with it
        assert exc.reason
        return
    for r in rows:
        out = map_row(MANIFEST_SPEC, r, NOW, CorrelationKeys.from_settings(CONF))
        assert isinstance(out, Mapped | Rejected)
        if isinstance(out, Rejected):
            assert out.reason
