"""Policy that holds for every tenant: static tokens give way to JWTs, tenant secrets have a
minimum length (and their errors never quote them), SNS deliveries are fresh and SHA-256
signed, Teams variables cannot style or mention, the API's docs are a development feature,
and provider endpoints are https outside development."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient
from pydantic import ValidationError

from notiflow.adapters.providers.webhook import WebhookRefused
from notiflow.chat_hooks import teams_escaped
from notiflow.gateway.app import build_app
from notiflow.gateway.auth import authenticate
from notiflow.gateway.errors import ApiError
from notiflow.providers.ses import sns
from notiflow.providers.ses.config import SesSettings
from notiflow.providers.ses.routes import authentic
from notiflow.schemas.enums import Channel
from notiflow.secrets import Keyring
from notiflow.settings import JwtAuth, Settings, TenantConfig

TOKEN = "nf_acme_" + "x" * 32
JWT_ON = JwtAuth(jwks_url="https://idp.example.test/jwks", issuer="https://idp.example.test",
                 audience="notiflow")


def login(settings: Settings, token: str) -> TenantConfig:
    request = SimpleNamespace(headers={"authorization": f"Bearer {token}"},
                              state=SimpleNamespace())
    rt = SimpleNamespace(settings=settings, keyring=Keyring(settings))
    return asyncio.run(authenticate(request, rt, None))  # type: ignore[arg-type]


def test_static_tokens_stop_when_jwts_are_configured_unless_asked_for() -> None:
    tenants = (TenantConfig.model_validate({"id": "acme", "token": TOKEN}),)
    assert login(Settings(tenants=tenants), TOKEN).id == "acme"
    with pytest.raises(ApiError) as refused:
        login(Settings(tenants=tenants, jwt=JWT_ON), TOKEN)
    assert (refused.value.status, refused.value.reason) == (401, "unknown_token")
    both = Settings(tenants=tenants, jwt=JWT_ON.model_copy(update={"static_tokens": True}))
    assert login(both, TOKEN).id == "acme"


SHORT = "hunter2-but-too-short"


@pytest.mark.parametrize("field,value,named", [
    ("token", SHORT, "token"),
    ("inbox_keys", [SHORT], "inbox_keys[0]"),
    ("inbox_keys", ["k" * 40, "ä" * 15], "inbox_keys[1]"),
    ("webhook_secrets", ["whsec_" + "QUJD" * 4], "webhook_secrets[0]"),
    ("webhook_secrets", ["whsec_not base64!" + SHORT], "webhook_secrets[0]"),
])
def test_short_tenant_secrets_fail_at_load_naming_tenant_and_field_only(
        field: str, value: Any, named: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError) as direct:
        TenantConfig.model_validate({"id": "acme", field: value})
    monkeypatch.setenv("NOTIFLOW_TENANTS", json.dumps([{"id": "acme", field: value}]))
    with pytest.raises(ValidationError) as loaded:
        Settings()
    for error in (str(direct.value), str(loaded.value)):
        assert f"tenant acme: {named}" in error
        assert SHORT not in error and "QUJD" not in error and "äää" not in error


def test_secrets_of_the_minimum_length_load() -> None:
    tenant = TenantConfig.model_validate({
        "id": "acme", "token": "t" * 32, "inbox_keys": ["k" * 32],
        "webhook_secrets": ["whsec_" + "QUJD" * 8, "QUJD" * 8]})
    assert tenant.token is not None


KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
TOPIC = "arn:aws:sns:us-east-1:123456789012:ses-events"
NOW = datetime.now(UTC)


def delivery(version: str = "2", at: datetime | None = None) -> bytes:
    at = at or datetime.now(UTC)
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
    doc = {"Type": sns.NOTIFICATION, "MessageId": "5f2a6d1e-0000-4000-8000-000000000001",
           "TopicArn": TOPIC, "Timestamp": stamp, "Message": '{"eventType":"Delivery"}',
           "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-a.pem"}
    return orjson.dumps({**doc, "SignatureVersion": version,
                         "Signature": sns.sign(doc, KEY, version)})


def check(raw: bytes, **config: Any) -> sns.SnsMessage:
    async def public_key(_url: str) -> rsa.RSAPublicKey:
        return KEY.public_key()

    runtime = SimpleNamespace(sns=lambda: SimpleNamespace(public_key=public_key))
    return asyncio.run(authentic(runtime, SesSettings(  # type: ignore[arg-type]
        sns_topic_arns=(TOPIC,), **config), raw))


def refusal(raw: bytes, **config: Any) -> str:
    with pytest.raises(ApiError) as refused:
        check(raw, **config)
    assert refused.value.status == 403
    return str(refused.value.reason)


def test_sns_takes_fresh_sha256_deliveries_only_by_default() -> None:
    now = datetime.now(UTC)
    assert check(delivery()).message_id.startswith("5f2a6d1e")
    assert refusal(delivery("1")) == "invalid_signature"
    assert check(delivery("1"), sns_signature_v1=True).type == sns.NOTIFICATION
    assert refusal(delivery(at=now - timedelta(hours=1, minutes=1))) == "stale_message"
    assert refusal(delivery(at=now + timedelta(hours=2))) == "stale_message"
    assert check(delivery(at=now - timedelta(minutes=50))).type == sns.NOTIFICATION
    assert refusal(delivery(at=now - timedelta(minutes=6)),
                   sns_max_age=timedelta(minutes=5)) == "stale_message"


@pytest.mark.parametrize("stamp", ["yesterday", "2026-12-06T08:00:00", ""])
def test_a_timestamp_without_a_time_and_offset_is_refused(stamp: str) -> None:
    with pytest.raises(WebhookRefused, match="Timestamp"):
        sns.check_fresh(sns.SnsMessage({"Timestamp": stamp}), NOW, timedelta(hours=1))


@pytest.mark.parametrize("variable,shown", [
    ("**urgent** _now_", r"\*\*urgent\*\* \_now\_"),
    ("[reset password](https://evil.example)", r"\[reset password\](https://evil.example)"),
    ("<at>General</at> &lt;at&gt;", r"\<at\>General\</at\> \&lt;at\&gt;"),
    ("# Title\n- one\n 2. two\n> quoted\n---", "\\# Title\n\\- one\n 2\\. two\n\\> quoted\n\\---"),
    ("`code` ~~gone~~ a\\b", r"\`code\` \~\~gone\~\~ a\\b"),
    ("Order 42.5 shipped, 3-5 days (UK) #1!", "Order 42.5 shipped, 3-5 days (UK) #1!"),
])
def test_teams_variables_are_shown_as_written(variable: str, shown: str) -> None:
    assert teams_escaped(variable) == shown


def test_the_render_stage_escapes_variables_for_teams_webhooks() -> None:
    from notiflow.flows.send.stages.render import escaping

    settings = Settings()
    ctx = SimpleNamespace(settings=settings, webhook_prefixes=settings.webhook_prefixes())
    work = SimpleNamespace(record=SimpleNamespace(
        channel=Channel.CHAT, recipient="https://acme.webhook.office.com/webhookb2/abc/x"))
    assert escaping(ctx, work) is teams_escaped  # type: ignore[arg-type]


@pytest.mark.parametrize("settings,served", [
    ({}, False), ({"environment": "development"}, True), ({"api_docs": True}, True),
    ({"environment": "development", "api_docs": False}, False)])
def test_api_docs_are_served_in_development_only_unless_configured(
        settings: dict[str, Any], served: bool) -> None:
    app = build_app(Settings(**settings))
    client = TestClient(app, raise_server_exceptions=False)
    for path in ("/openapi.json", "/docs", "/redoc"):
        assert (client.get(path).status_code == 200) is served, path
    assert app.openapi()["info"]["title"] == "notiflow Messaging API"


@pytest.mark.parametrize("override,setting", [
    ({"twilio": {"base_url": "http://api.twilio.com"}}, "twilio.base_url"),
    ({"sendgrid": {"base_url": "http://10.0.0.7/sendgrid"}}, "sendgrid.base_url"),
    ({"ses": {"endpoint_url": "http://email.us-east-1.amazonaws.com"}}, "ses.endpoint_url"),
    ({"fcm": {"token_uri": "http://oauth2.googleapis.com/token"}}, "fcm.token_uri"),
    ({"vonage": {"base_url": "http://rest.nexmo.com"}}, "vonage.base_url"),
    ({"apns": {"base_url": "http://api.push.apple.com"}}, "apns.base_url"),
    ({"teams": {"webhook_prefixes": ["http://*.webhook.office.com/webhookb2/"]}},
     "teams.webhook_prefixes"),
    ({"jwt": {**JWT_ON.model_dump(), "jwks_url": "http://idp.example.test/jwks"}},
     "jwt.jwks_url"),
])
def test_provider_endpoints_are_https_outside_development(
        override: dict[str, Any], setting: str) -> None:
    with pytest.raises(ValidationError, match=setting.replace(".", r"\.")):
        Settings(**override)
    assert Settings(environment="development", **override).environment == "development"


def test_https_and_loopback_endpoints_load_anywhere() -> None:
    s = Settings(twilio={"base_url": "https://api.twilio.com"},
                 vonage={"base_url": "http://[::1]:18090/vonage"},
                 sendgrid={"base_url": "http://localhost:18090/sendgrid"})
    assert s.environment == "production" and not s.serves_api_docs
