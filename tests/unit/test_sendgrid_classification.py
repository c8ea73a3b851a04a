"""The SendGrid classification tables row by row, the request body and the Event Webhook
signature (pure; no network)."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import SecretStr

from notiflow.adapters.providers.base import DevEndpoints, Outcome
from notiflow.adapters.providers.common import Rule
from notiflow.providers.sendgrid.classify import (
    FIELD_RULES,
    HTTP_STATUSES,
    STATUS_CLASSES,
    classify_response,
    error_fields_of,
    field_rule,
    rate_limit_wait,
)
from notiflow.providers.sendgrid.client import SendGridEmail
from notiflow.providers.sendgrid.config import SendGridSettings
from notiflow.providers.sendgrid.dev import environment as dev_environment
from notiflow.providers.sendgrid.signature import (
    event_signature,
    load_event_public_key,
    verify_event_signature,
)
from notiflow.schemas.enums import Channel, PushPlatform
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
from tests.unit import classification_cases as cases
from tests.unit.classification_cases import A, P, T

EXPECTED_STATUSES: dict[int, tuple[Outcome, str]] = {
    **cases.HTTP_DEFAULT_STATUSES,
    406: (T, "misconfigured"),
    451: (T, "misconfigured"),
}

EXPECTED_FIELDS: dict[str, tuple[Outcome, str]] = {
    "personalizations.0.to.0.email": (P, "invalid_recipient"),
    "personalizations.3.to": (P, "invalid_recipient"),
    "personalizations.0.cc.1.email": (P, "invalid_recipient"),
    "personalizations.0.bcc.0.email": (P, "invalid_recipient"),
    "from": (T, "misconfigured"),
    "from.email": (T, "misconfigured"),
    "reply_to.email": (T, "misconfigured"),
    "subject": (P, "invalid_content"),
    "personalizations.0.subject": (P, "invalid_content"),
    "content": (P, "invalid_content"),
    "content.0.value": (P, "invalid_content"),
}

# SendGrid's published Event Webhook test vector (key, payload, signature, timestamp).
VECTOR_KEY = ("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBc"
              "epxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==")
VECTOR_PAYLOAD = b'{"category":"example_payload","event":"test_event","message_id":"message_id"}'
VECTOR_SIGNATURE = ("MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsb"
                    "VRamr2nlxFDWYNH2j/0=")
VECTOR_TIMESTAMP = "1588788367"
OTHER_KEY = ("MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqTxd43gyp8IOEto2LdIfjRQrIbsd4SXZkLW6jDutdhXSJCWH"
             "w8REntlo7aNDthvj+y7GjUuFDb/R1NGe1OPzpA==")


def test_tables_have_exactly_the_reviewed_rows() -> None:
    cases.assert_http_tables(HTTP_STATUSES, STATUS_CLASSES, EXPECTED_STATUSES)
    assert len(FIELD_RULES) == 5


@pytest.mark.parametrize(("status", "expected"), sorted(EXPECTED_STATUSES.items()))
def test_http_status_row(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status) == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"), sorted(EXPECTED_STATUSES.items()))
def test_http_status_row_with_unknown_field(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status, ["template_id", None]) == Rule(*expected)


@pytest.mark.parametrize(("field", "expected"), sorted(EXPECTED_FIELDS.items()))
def test_field_row(field: str, expected: tuple[Outcome, str]) -> None:
    assert field_rule(field) == Rule(*expected)
    assert classify_response(400, [field]) == Rule(*expected)


@pytest.mark.parametrize("field", ["fromage", "personalizations", "template_id", "subjects",
                                   "custom_args", "x.from"])
def test_unknown_fields(field: str) -> None:
    assert field_rule(field) is None
    assert classify_response(400, [field]) == Rule(P, "rejected")


def test_sender_field_wins_over_recipient_and_content() -> None:
    fields = ["personalizations.0.to.0.email", "subject", "from.email"]
    assert classify_response(400, fields) == Rule(T, "misconfigured")
    assert classify_response(400, ["subject", "personalizations.0.to.0.email"]) == Rule(
        P, "invalid_content")


def test_fields_only_refine_a_400() -> None:
    assert classify_response(403, ["from"]) == Rule(T, "misconfigured")
    assert classify_response(413, ["personalizations.0.to.0.email"]) == Rule(
        P, "invalid_content")
    assert classify_response(500, ["subject"]) == Rule(A, "server_error")


@pytest.mark.parametrize(("status", "expected"),
                         cases.status_class_cases(102, 200, 302, 418, 422, 507, 600))
def test_status_class_fallback(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status) == Rule(*expected)


def test_only_permanent_rules_never_deactivate() -> None:
    assert not any(r.deactivate for r in HTTP_STATUSES.values())
    assert not any(r.deactivate for _, r in FIELD_RULES)


def test_credentials_never_fail_a_message_permanently() -> None:
    for status in (401, 403, 404, 406, 451):
        assert HTTP_STATUSES[status].outcome is T


@pytest.mark.parametrize(("payload", "fields"), [
    ({"errors": [{"message": "x", "field": "subject", "help": None},
                 {"message": "y", "field": None}]}, ["subject", None]),
    ({"errors": [{"message": "x"}, "junk", {"field": 3}]}, [None, None]),
    ({"errors": "nope"}, []),
    ({"message": "x"}, []),
    ([1], []),
    (None, []),
])
def test_error_fields_of(payload: object, fields: list[str | None]) -> None:
    assert error_fields_of(payload) == fields


def test_rate_limit_wait() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    reset = str(int(now.timestamp()) + 30)
    assert rate_limit_wait({"X-RateLimit-Reset": reset}, now=now) == 30.0
    assert rate_limit_wait({"X-RateLimit-Reset": str(int(now.timestamp()) - 5)}, now=now) == 0.0
    assert rate_limit_wait({"Retry-After": "7", "X-RateLimit-Reset": reset}, now=now) == 7.0
    date = format_datetime(now + timedelta(seconds=12), usegmt=True)
    assert rate_limit_wait({"Retry-After": date}, now=now) == 12.0
    assert rate_limit_wait({"X-RateLimit-Reset": "soon"}, now=now) is None
    assert rate_limit_wait({}, now=now) is None


def test_published_event_webhook_vector() -> None:
    assert verify_event_signature(VECTOR_KEY, VECTOR_PAYLOAD, VECTOR_SIGNATURE, VECTOR_TIMESTAMP)
    assert not verify_event_signature(OTHER_KEY, VECTOR_PAYLOAD, VECTOR_SIGNATURE,
                                      VECTOR_TIMESTAMP)
    assert not verify_event_signature(VECTOR_KEY, b"payload", VECTOR_SIGNATURE, VECTOR_TIMESTAMP)
    assert not verify_event_signature(VECTOR_KEY, VECTOR_PAYLOAD, VECTOR_SIGNATURE, "timestamp")
    bad = VECTOR_SIGNATURE.replace("YNH2j", "YNH3j")
    assert not verify_event_signature(VECTOR_KEY, VECTOR_PAYLOAD, bad, VECTOR_TIMESTAMP)
    assert not verify_event_signature(VECTOR_KEY, VECTOR_PAYLOAD, "not base64!", VECTOR_TIMESTAMP)
    assert not verify_event_signature(VECTOR_KEY, VECTOR_PAYLOAD, None, VECTOR_TIMESTAMP)
    assert not verify_event_signature(VECTOR_KEY, VECTOR_PAYLOAD, VECTOR_SIGNATURE, None)


def test_sign_then_verify_round_trip() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    der = public.public_bytes(serialization.Encoding.DER,
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    pem = public.public_bytes(serialization.Encoding.PEM,
                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    payload = b'[{"event":"delivered"}]\r\n'
    sig = event_signature(key, "1700000000", payload)
    for form in (base64.b64encode(der).decode(), pem, public):
        assert verify_event_signature(form, payload, sig, "1700000000")
    assert not verify_event_signature(public, payload, sig, "1700000001")
    assert isinstance(load_event_public_key(pem), ec.EllipticCurvePublicKey)


def _config(**kw: Any) -> SendGridSettings:
    return SendGridSettings(api_key=SecretStr("SG.test"), **kw)


_message = partial(cases.outbound, channel=Channel.EMAIL, attempt=2,
                   recipient="ada@example.com", body="Hello", subject="Hi")


async def test_request_body() -> None:
    async with aiohttp.ClientSession() as session:
        client = SendGridEmail(_config(from_email="n@example.com", from_name="Notify"),
                               session, timeout=1.0)
        assert client.payload(_message()) == {
            "personalizations": [{"to": [{"email": "ada@example.com"}]}],
            "from": {"email": "n@example.com", "name": "Notify"},
            "subject": "Hi",
            "content": [{"type": "text/plain", "value": "Hello"}],
            "custom_args": {"message_id": "msg_1", "attempt": "2"},
        }
        bare = SendGridEmail(_config(from_name=None), session, timeout=1.0)
        body = bare.payload(_message(subject=None))
        assert "subject" not in body and body["from"] == {"email": "notifications@example.com"}


async def test_push_recipient_is_permanent_without_a_request() -> None:
    token = PushRecipient(device_token="d" * 40, platform=PushPlatform.ANDROID)
    result = await cases.send_once(
        lambda session: SendGridEmail(_config(base_url="http://127.0.0.1:9"), session,
                                      timeout=1.0),
        _message(recipient=token))
    assert (result.outcome, result.reason) == (P, "invalid_recipient")


async def test_open_requires_an_api_key() -> None:
    with pytest.raises(ValueError, match="api_key"):
        await SendGridEmail.open(SendGridSettings(), timeout=1.0)


def test_email_is_enabled_by_the_api_key() -> None:
    assert Channel.EMAIL not in Settings().enabled_channels()
    on = Settings(sendgrid=_config())
    assert Channel.EMAIL in on.enabled_channels()
    assert on.provider_rates["sendgrid"] > 0


def test_dev_credentials_carry_a_matching_webhook_key_pair(tmp_path: Path) -> None:
    endpoints = DevEndpoints.loopback(fakes_port=2, webhook_port=1, apns_port=3, tls_dir=tmp_path)
    env = dev_environment(endpoints)
    assert env["NOTIFLOW_SENDGRID__API_KEY"].startswith("SG.")
    assert env["NOTIFLOW_SENDGRID__BASE_URL"] == "http://127.0.0.1:2/sendgrid"
    assert env["NOTIFLOW_SENDGRID__EVENT_WEBHOOK_URL"] == "http://127.0.0.1:1/webhooks/sendgrid"
    key = serialization.load_pem_private_key(
        env["NOTIFLOW_SENDGRID__EVENT_WEBHOOK_SIGNING_KEY"].encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    sig = event_signature(key, "1", b"[]")
    assert verify_event_signature(env["NOTIFLOW_SENDGRID__EVENT_WEBHOOK_PUBLIC_KEY"], b"[]", sig,
                                  "1")
    assert dev_environment(endpoints) != env
