"""The SES v2 adapter's pure parts: its ``SendEmail`` body against botocore's own service model
(the SDK's validator), its SigV4 headers against the emulator's check, and its
classification table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.session
import orjson
import pytest
from botocore.validate import ParamValidator
from pydantic import SecretStr

from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.providers.ses.classify import (
    ERROR_TYPES,
    classify_response,
    error_message,
    error_type,
)
from notiflow.providers.ses.client import credentials, send_email_body, signed_headers
from notiflow.providers.ses.config import SesSettings
from notiflow.providers.ses.emulator import Refused, verify_signature
from notiflow.schemas.enums import Channel, Tier

CONFIG = SesSettings(endpoint_url="http://127.0.0.1:18090/ses", region="eu-west-1",
                     access_key_id="AKIAEXAMPLE000000001",
                     secret_access_key=SecretStr("s3cr3t/key"), configuration_set="events")
URL = "http://127.0.0.1:18090/ses/v2/email/outbound-emails"
PATH = "/ses/v2/email/outbound-emails"


def message(**kw: Any) -> OutboundMessage:
    doc: dict[str, Any] = {"message_id": "msg_0a1b", "attempt": 2, "tenant_id": "acme",
                           "channel": Channel.EMAIL, "tier": Tier.P1,
                           "recipient": "ada@example.com", "body": "Your code is 1",
                           "subject": "Your code"}
    doc.update(kw)
    return OutboundMessage(**doc)


def payload(msg: OutboundMessage) -> dict[str, Any]:
    return send_email_body(CONFIG, msg, "00-" + "a" * 32 + "-" + "b" * 16 + "-01")


def send_email_shape() -> Any:
    model = botocore.session.get_session().get_service_model("sesv2")
    return model.operation_model("SendEmail").input_shape


@pytest.mark.parametrize("msg", [message(), message(sender="billing@acme.example"),
                                 message(body="Grüße ✓", subject="Ünïcode")])
def test_the_body_is_what_the_sdk_would_send(msg: OutboundMessage) -> None:
    body = payload(msg)
    report = ParamValidator().validate(body, send_email_shape())
    assert not report.has_errors(), report.generate_report()
    assert body["Destination"] == {"ToAddresses": ["ada@example.com"]}
    assert body["ConfigurationSetName"] == "events"
    assert {t["Name"]: t["Value"] for t in body["EmailTags"]} == {
        "message_id": "msg_0a1b", "attempt": "2",
        "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    assert body["FromEmailAddress"] == (msg.sender or CONFIG.from_email)


def test_a_message_without_subject_omits_it() -> None:
    assert "Subject" not in payload(message(subject=None))["Content"]["Simple"]


def headers_of(body: bytes, config: SesSettings = CONFIG) -> dict[str, str]:
    signed = signed_headers(credentials(config), config.region, URL, body)
    return {"host": "127.0.0.1:18090", **{k.lower(): v for k, v in signed.items()}}


KEYS = {"AKIAEXAMPLE000000001": "s3cr3t/key"}


def test_the_emulator_accepts_the_adapters_signature_and_nothing_else() -> None:
    body = orjson.dumps(payload(message()))
    headers = headers_of(body)
    now = datetime.now(UTC)
    assert headers["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE000000001/")
    assert "/eu-west-1/ses/aws4_request" in headers["authorization"]
    assert verify_signature(headers, "POST", PATH, body, KEYS, now) == "AKIAEXAMPLE000000001"
    cases = {
        "tampered body": (headers, body + b" ", KEYS, now, "SignatureDoesNotMatch"),
        "other secret": (headers, body, {"AKIAEXAMPLE000000001": "other"}, now,
                         "SignatureDoesNotMatch"),
        "unknown key": (headers, body, {}, now, "UnrecognizedClientException"),
        "stale": (headers, body, KEYS, now + timedelta(minutes=6),
                  "InvalidSignatureException"),
        "unsigned": ({"host": headers["host"]}, body, KEYS, now, "IncompleteSignature"),
    }
    for name, (h, b, keys, at, kind) in cases.items():
        with pytest.raises(Refused) as refused:
            verify_signature(h, "POST", PATH, b, keys, at)
        assert (refused.value.status, refused.value.kind) == (403, kind), name


def test_a_session_token_is_signed_too() -> None:
    config = CONFIG.model_copy(update={"session_token": SecretStr("token-1")})
    headers = headers_of(b"{}", config)
    assert headers["x-amz-security-token"] == "token-1"
    assert "x-amz-security-token" in headers["authorization"]


def test_missing_credentials_refuse_to_open() -> None:
    with pytest.raises(ValueError, match="not configured"):
        credentials(SesSettings())


@pytest.mark.parametrize(("header", "body", "kind"), [
    ("MessageRejected:http://internal.amazon.com/coral/com.amazonaws.sesv2/", None,
     "MessageRejected"),
    ("TooManyRequestsException", {}, "TooManyRequestsException"),
    (None, {"__type": "com.amazonaws.sesv2#NotFoundException"}, "NotFoundException"),
    (None, {"code": "AccountSuspendedException"}, "AccountSuspendedException"),
    (None, {"message": "no type"}, None),
    (None, None, None),
])
def test_error_type_is_read_like_the_sdk_reads_it(header: str | None, body: Any,
                                                 kind: str | None) -> None:
    assert error_type(header, body) == kind


def test_the_table() -> None:
    permanent = {k for k, r in ERROR_TYPES.items() if r.outcome is Outcome.PERMANENT}
    assert permanent == {"BadRequestException", "MessageRejected", "LimitExceededException"}
    assert not any(r.deactivate for r in ERROR_TYPES.values())
    assert classify_response(500, "InternalFailure").outcome is Outcome.AMBIGUOUS
    assert classify_response(429, None).reason == "rate_limited"
    assert classify_response(403, None).reason == "auth_failed"
    assert classify_response(400, "SomethingNew").reason == "rejected"
    unverified = classify_response(400, "MessageRejected", error_message(
        {"message": "Email address is not verified. The following identities failed"}))
    assert (unverified.outcome, unverified.reason) == (Outcome.TRANSIENT, "misconfigured")
    assert classify_response(400, "MessageRejected", "Message rejected").outcome \
        is Outcome.PERMANENT


def test_ses_is_an_email_route_once_its_key_is_configured() -> None:
    from notiflow.flows.send.routing import rank_routes
    from notiflow.settings import Settings

    off = Settings(sendgrid={"api_key": "SG.x"}, smtp={"username": "u", "password": "p"})
    on = off.model_copy(update={"ses": CONFIG})
    assert "ses" not in off.enabled_providers()
    assert "ses" in on.enabled_providers()

    def order(settings: Settings, tier: Tier) -> list[str]:
        return [r.provider_id for r in rank_routes(
            settings.routes, tier=tier, channel=Channel.EMAIL, recipient="ada@example.com",
            enabled=settings.enabled_providers())]

    assert order(off, Tier.P3) == ["smtp", "sendgrid"]
    assert order(on, Tier.P3) == ["ses", "smtp", "sendgrid"]
    assert order(on, Tier.P0) == ["sendgrid", "ses", "smtp"]
