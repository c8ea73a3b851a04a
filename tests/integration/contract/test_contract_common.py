"""Contract suite: every real provider adapter against its emulator in ``notiflow fakes``.

Each adapter is one :class:`Harness` (how to build it, which recipients trigger which provider
answer, what wrong credentials look like on the wire); add a provider by appending its harness
to ``HARNESSES``. The generic cases run for every harness; Twilio-style per-message status
callbacks run for harnesses with a :class:`CallbackSpec`; SendGrid's Event Webhook and FCM's
OAuth2 token handling have their own cases at the end. Emulators share the knob names of
``docs/providers.md``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qsl, urlsplit

import aiosmtplib
import httpx
import jwt
import orjson
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import SecretStr

from notiflow.adapters.providers.apns.client import ApnsPush
from notiflow.adapters.providers.apns.tokens import provider_token
from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.fcm.client import FcmPush
from notiflow.adapters.providers.fcm.tokens import AccessTokens, ServiceAccount
from notiflow.adapters.providers.sendgrid.client import SendGridEmail
from notiflow.adapters.providers.ses.client import SesEmail
from notiflow.adapters.providers.slack.client import SlackWebhook
from notiflow.adapters.providers.smtp.bounces import bounce_address
from notiflow.adapters.providers.smtp.client import SmtpEmail
from notiflow.adapters.providers.teams.client import TeamsWebhook
from notiflow.adapters.providers.twilio.client import TwilioSms
from notiflow.adapters.providers.twilio.signature import signature
from notiflow.adapters.providers.vonage.client import VonageSms
from notiflow.adapters.providers.vonage.signature import verify_signature
from notiflow.correlation import CorrelationKeys
from notiflow.devenv import free_port
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings

pytestmark = pytest.mark.integration

Overrides = Mapping[str, Any]
"""Generic provider overrides: ``base_url``, ``secret``, ``callback_url``, ``sender``."""
Recipient = str | PushRecipient


class TimedClient(Protocol):
    """A provider client whose ``send`` takes a per-call timeout (every adapter here)."""

    provider_id: str

    async def send(self, message: OutboundMessage, *,
                   timeout: float | None = None) -> SendResult: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Rejection:
    """A recipient the provider refuses for good, and the expected classification."""

    scenario: str
    reason: str
    deactivate: bool = False


@dataclass(frozen=True)
class CallbackSpec:
    """Twilio-style status callbacks: per message, form-encoded, to the message's URL."""

    verify: Callable[[str, str, Mapping[str, str], Mapping[str, str]], bool]
    """(secret, url, form params, headers) → signature valid."""
    secret: Callable[[Settings], str]
    message_id_field: str
    """Form field that carries the provider message id."""
    status_field: str
    final_statuses: tuple[str, str] = ("delivered", "undelivered")
    error_field: str = "ErrorCode"


class RawAnswer(Protocol):
    """A raw answer to a request with a wrong secret (an HTTP response, or an SMTP reply)."""

    @property
    def status_code(self) -> int: ...

    def json(self) -> Any: ...


@dataclass(frozen=True)
class Harness:
    """What the contract suite needs to know about one adapter and its emulator."""

    name: str
    admin: str
    """Path segment of the emulator's admin API (``/_admin/{admin}/...``)."""
    channel: Channel
    recipients: Mapping[str, Recipient]
    """Scenario → recipient: ``ok`` plus one per :attr:`rejections` entry."""
    rejections: tuple[Rejection, ...]
    configure: Callable[[Settings, Overrides], Settings]
    open: Callable[[Settings, float], Awaitable[TimedClient]]
    unauthorized: Callable[[Settings], Awaitable[RawAnswer]]
    """A raw request with a wrong secret."""
    unauthorized_body: Mapping[str, Any]
    wrong_secret: Callable[[], str]
    auth_rule: tuple[Outcome, str]
    unauthorized_records: tuple[str, ...]
    """Record outcomes the emulator keeps for one send with a wrong secret."""
    provider_message_id: re.Pattern[str]
    empty_body_rule: tuple[Outcome, str] | None
    """Classification of an empty body, if the provider refuses one."""
    exact_retry_after: bool = True
    """False when the provider gives a reset time (whole seconds) instead of Retry-After."""
    retry_after: bool = True
    """False when the provider's 429 states no wait at all (APNs)."""
    unauthorized_status: int = 401
    """HTTP status of a request with a wrong secret (APNs: 403; Vonage: 200, SMTP: 535)."""
    callbacks: CallbackSpec | None = None
    http: bool = True
    """False when the protocol has no HTTP status errors (SMTP: no ``error_rate_5xx``)."""
    recorded_to: Callable[[Recipient], str] | None = None
    """What the emulator records as ``to`` (default :func:`recipient_text`)."""
    sender: tuple[str, str, str] | None = None
    """A message's own sender: what the message names, the record field the emulator shows
    the recipient's view of it in, and how it shows it; None when the channel has none."""
    credentials: bool = True
    """False when the provider has no account secret (a chat webhook: the URL is it)."""
    rebase: Callable[[Recipient, str], Recipient] | None = None
    """The recipient at another origin, for a provider whose recipient is the URL it calls."""

    def recorded(self, recipient: Recipient) -> str:
        return (self.recorded_to or recipient_text)(recipient)


def recipient_text(recipient: Recipient) -> str:
    """What the emulator records as ``to``."""
    return recipient.device_token if isinstance(recipient, PushRecipient) else recipient


def configure_section(section: str,
                      names: Mapping[str, str]) -> Callable[[Settings, Overrides], Settings]:
    """A ``configure`` that sets the fields ``names`` maps the generic overrides to in
    ``settings.{section}`` (``secret`` as a ``SecretStr``; overrides not named are ignored)."""

    def configure(settings: Settings, overrides: Overrides) -> Settings:
        update = {names[k]: SecretStr(v) if k == "secret" else v for k, v in overrides.items()
                  if k in names}
        config = getattr(settings, section).model_copy(update=update)
        return settings.model_copy(update={section: config})

    return configure


def opener(adapter: Any) -> Callable[[Settings, float], Awaitable[TimedClient]]:
    """An ``open`` that calls ``adapter.open(settings, timeout=...)``."""

    async def open_client(settings: Settings, timeout: float) -> TimedClient:
        client: TimedClient = await adapter.open(settings, timeout=timeout)
        return client

    return open_client


# Twilio --------------------------------------------------------------------------------------


async def _twilio_unauthorized(settings: Settings) -> httpx.Response:
    t = settings.twilio
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            f"{t.base_url}/2010-04-01/Accounts/{t.account_sid}/Messages.json",
            data={"To": "+14155550100", "From": t.from_number, "Body": "hi"},
            auth=(t.account_sid, "not-the-token"))


def twilio_documented_signature(token: str, url: str, params: Mapping[str, str]) -> str:
    """Twilio's documented algorithm, written independently of the code under test."""
    data = url
    for key in sorted(params):
        data += key + params[key]
    mac = hmac.new(token.encode("utf-8"), data.encode("utf-8"), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def _twilio_verify(secret: str, url: str, params: Mapping[str, str],
                   headers: Mapping[str, str]) -> bool:
    given = headers.get("X-Twilio-Signature", "")
    return hmac.compare_digest(twilio_documented_signature(secret, url, params), given)


def _twilio_secret(settings: Settings) -> str:
    assert settings.twilio.auth_token is not None
    return settings.twilio.auth_token.get_secret_value()


TWILIO = Harness(
    name="twilio",
    sender=("+14155550111", "from", "+14155550111"),
    admin="twilio",
    channel=Channel.SMS,
    recipients={"ok": "+14155550100", "invalid": "+15005550001",
                "unsubscribed": "+15005550004", "unreachable": "+15005550002",
                "not_mobile": "+15005550009", "region": "+15005550003"},
    rejections=(Rejection("invalid", "invalid_recipient"),
                Rejection("unsubscribed", "unsubscribed", deactivate=True),
                Rejection("unreachable", "unreachable_recipient"),
                Rejection("not_mobile", "not_mobile"),
                Rejection("region", "region_not_permitted")),
    configure=configure_section("twilio", {
        "base_url": "base_url", "secret": "auth_token", "callback_url": "status_callback_url",
        "sender": "from_number"}),
    open=opener(TwilioSms),
    unauthorized=_twilio_unauthorized,
    unauthorized_body={"code": 20003, "message": "Authenticate",
                       "more_info": "https://www.twilio.com/docs/errors/20003", "status": 401},
    wrong_secret=lambda: "x" * 32,
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    unauthorized_records=("unauthorized",),
    provider_message_id=re.compile(r"SM[0-9a-f]{32}"),
    empty_body_rule=(Outcome.PERMANENT, "invalid_content"),
    callbacks=CallbackSpec(verify=_twilio_verify, secret=_twilio_secret,
                           message_id_field="MessageSid", status_field="MessageStatus"),
)


# SendGrid ------------------------------------------------------------------------------------


async def _sendgrid_unauthorized(settings: Settings) -> httpx.Response:
    s = settings.sendgrid
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            f"{s.base_url}/v3/mail/send", headers={"Authorization": "Bearer SG.not-the-key"},
            json={"personalizations": [{"to": [{"email": "ada@example.com"}]}],
                  "from": {"email": s.from_email}, "subject": "hi",
                  "content": [{"type": "text/plain", "value": "hi"}]})


SENDGRID = Harness(
    name="sendgrid",
    sender=("billing@acme.example", "from", "billing@acme.example"),
    admin="sendgrid",
    channel=Channel.EMAIL,
    recipients={"ok": "ada@example.com", "invalid": "nobody@invalid.example.com",
                "malformed": "not-an-address"},
    rejections=(Rejection("invalid", "invalid_recipient"),
                Rejection("malformed", "invalid_recipient")),
    configure=configure_section("sendgrid", {
        "base_url": "base_url", "secret": "api_key", "sender": "from_email"}),
    open=opener(SendGridEmail),
    unauthorized=_sendgrid_unauthorized,
    unauthorized_body={"errors": [{
        "message": "The provided authorization grant is invalid, expired, or revoked",
        "field": None, "help": None}]},
    wrong_secret=lambda: "SG.wrong." + "x" * 32,
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    unauthorized_records=("unauthorized",),
    provider_message_id=re.compile(r"[A-Za-z0-9_-]{22}"),
    empty_body_rule=(Outcome.PERMANENT, "invalid_content"),
    exact_retry_after=False,
)


# SES -----------------------------------------------------------------------------------------


def _ses_configure(settings: Settings, overrides: Overrides) -> Settings:
    """The session's SES section with the emulator's key pair, then the generic overrides."""
    keyed = settings.ses.model_copy(update={
        "access_key_id": settings.fakes_ses_access_key_id,
        "secret_access_key": settings.fakes_ses_secret_access_key})
    return configure_section("ses", {
        "base_url": "endpoint_url", "secret": "secret_access_key", "sender": "from_email"})(
        settings.model_copy(update={"ses": keyed}), overrides)


async def _ses_unauthorized(settings: Settings) -> httpx.Response:
    s = settings.ses
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            f"{s.endpoint_url}/v2/email/outbound-emails", headers={
                "X-Amz-Date": stamp, "Authorization": (
                    f"AWS4-HMAC-SHA256 Credential=AKIANOTTHEKEY0000000/{stamp[:8]}/"
                    f"{s.region}/ses/aws4_request, SignedHeaders=host;x-amz-date, "
                    f"Signature={'0' * 64}")},
            json={"FromEmailAddress": s.from_email,
                  "Destination": {"ToAddresses": ["ada@example.com"]},
                  "Content": {"Simple": {"Subject": {"Data": "hi"},
                                         "Body": {"Text": {"Data": "hi"}}}}})


SES = Harness(
    name="ses",
    sender=("billing@acme.example", "from", "billing@acme.example"),
    admin="ses",
    channel=Channel.EMAIL,
    recipients={"ok": "ada@example.com", "malformed": "not-an-address",
                "refused": "kim@reject.example.com"},
    rejections=(Rejection("malformed", "rejected"), Rejection("refused", "content_rejected")),
    configure=_ses_configure,
    open=opener(SesEmail),
    unauthorized=_ses_unauthorized,
    unauthorized_body={"message": "The security token included in the request is invalid."},
    wrong_secret=lambda: "wrong/" + "x" * 34,
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    unauthorized_records=("unauthorized",),
    provider_message_id=re.compile(r"0100[0-9a-f]{24}-[0-9a-f]{8}-000000"),
    empty_body_rule=None,
    retry_after=False,
    unauthorized_status=403,
)


# FCM -----------------------------------------------------------------------------------------


def _rsa_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


async def _fcm_unauthorized(settings: Settings) -> httpx.Response:
    f = settings.fcm
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(
            f"{f.base_url}/v1/projects/{f.project_id}/messages:send",
            headers={"Authorization": "Bearer ya29.not-a-token"},
            json={"message": {"token": "d" * 64, "notification": {"body": "hi"}}})


def device(prefix: str = "d", platform: PushPlatform = PushPlatform.ANDROID) -> PushRecipient:
    return PushRecipient(device_token=f"{prefix}-{uuid.uuid4().hex}{uuid.uuid4().hex}",
                         platform=platform)


FCM = Harness(
    name="fcm",
    admin="fcm",
    channel=Channel.PUSH,
    recipients={"ok": device(), "unregistered": device("unregistered"),
                "invalid": device("invalid"), "mismatch": device("mismatch")},
    rejections=(Rejection("unregistered", "unregistered", deactivate=True),
                Rejection("invalid", "rejected"),
                Rejection("mismatch", "sender_id_mismatch")),
    configure=configure_section("fcm", {"base_url": "base_url", "secret": "private_key"}),
    open=opener(FcmPush),
    unauthorized=_fcm_unauthorized,
    unauthorized_body={"error": {
        "code": 401, "status": "UNAUTHENTICATED",
        "message": "Request had invalid authentication credentials. Expected OAuth 2 access "
                   "token, login cookie or other valid authentication credential. See "
                   "https://developers.google.com/identity/sign-in/web/devconsole-project."}},
    wrong_secret=_rsa_pem,
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    unauthorized_records=(),
    provider_message_id=re.compile(r"projects/[a-z0-9-]+/messages/0:\d+%[0-9a-f]{16}"),
    empty_body_rule=None,
)


# APNs ----------------------------------------------------------------------------------------


def _ec_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def apns_http(settings: Settings) -> httpx.AsyncClient:
    """An independent HTTP/2 client trusting the emulator's test CA (raw requests)."""
    context = ssl.create_default_context(cafile=settings.apns.ca_file)
    return httpx.AsyncClient(http2=True, http1=False, verify=context, timeout=10)


def apns_headers(settings: Settings, token: str) -> dict[str, str]:
    return {"authorization": f"bearer {token}", "apns-topic": settings.apns.topic,
            "apns-push-type": "alert"}


async def _apns_unauthorized(settings: Settings) -> httpx.Response:
    a = settings.apns
    assert a.team_id and a.key_id
    key = serialization.load_pem_private_key(_ec_pem().encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    token = provider_token(a.team_id, a.key_id, key, datetime.now(UTC))
    async with apns_http(settings) as client:
        return await client.post(f"{a.base_url}/3/device/{'ab' * 32}",
                                 headers=apns_headers(settings, token),
                                 content=b'{"aps": {"alert": "hi"}}')


def ios_device(prefix: str = "0123") -> PushRecipient:
    token = (prefix + uuid.uuid4().hex + uuid.uuid4().hex)[:64]
    return PushRecipient(device_token=token, platform=PushPlatform.IOS)


APNS = Harness(
    name="apns",
    admin="apns",
    channel=Channel.PUSH,
    recipients={"ok": ios_device(), "bad_token": ios_device("bad0"),
                "unregistered": ios_device("dead"), "all_zero": ios_device("0" * 64),
                "expired_token": ios_device("deac"), "not_for_topic": ios_device("f0f0")},
    rejections=(Rejection("bad_token", "invalid_recipient", deactivate=True),
                Rejection("unregistered", "unregistered", deactivate=True),
                Rejection("all_zero", "unregistered", deactivate=True),
                Rejection("expired_token", "unregistered", deactivate=True),
                Rejection("not_for_topic", "token_not_for_topic")),
    configure=configure_section("apns", {"base_url": "base_url", "secret": "private_key"}),
    open=opener(ApnsPush),
    unauthorized=_apns_unauthorized,
    unauthorized_body={"reason": "InvalidProviderToken"},
    wrong_secret=_ec_pem,
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    unauthorized_records=("unauthorized",),
    provider_message_id=re.compile(
        r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"),
    empty_body_rule=None,
    retry_after=False,
    unauthorized_status=403,
)

# Vonage --------------------------------------------------------------------------------------


async def _vonage_unauthorized(settings: Settings) -> httpx.Response:
    v = settings.vonage
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(f"{v.base_url}/sms/json", data={
            "api_key": v.api_key, "api_secret": "not-the-secret", "from": v.from_name,
            "to": "14155550100", "text": "hi"})


VONAGE = Harness(
    name="vonage",
    sender=("+14155550111", "from", "14155550111"),
    admin="vonage",
    channel=Channel.SMS,
    recipients={"ok": "+14155550100", "invalid": "+0123", "unroutable": "+447700900006",
                "barred": "+447700900007", "not_whitelisted": "+447700900029",
                "deactivated": "+447700900033", "opted_out": "+447700900101"},
    rejections=(Rejection("invalid", "invalid_recipient"),
                Rejection("unroutable", "unroutable"),
                Rejection("barred", "recipient_barred"),
                Rejection("not_whitelisted", "unverified_recipient"),
                Rejection("deactivated", "deactivated_recipient", deactivate=True),
                Rejection("opted_out", "unsubscribed", deactivate=True)),
    configure=configure_section("vonage", {
        "base_url": "base_url", "secret": "api_secret", "callback_url": "status_callback_url",
        "sender": "from_name"}),
    open=opener(VonageSms),
    unauthorized=_vonage_unauthorized,
    unauthorized_body={"message-count": "1",
                       "messages": [{"status": "4", "error-text": "Bad Credentials"}]},
    wrong_secret=lambda: "x" * 16,
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    unauthorized_records=("unauthorized",),
    provider_message_id=re.compile(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"),
    empty_body_rule=(Outcome.PERMANENT, "invalid_content"),
    unauthorized_status=200,
    recorded_to=lambda recipient: str(recipient).removeprefix("+"),
)


# SMTP ----------------------------------------------------------------------------------------


def _smtp_configure(settings: Settings, overrides: Overrides) -> Settings:
    update: dict[str, Any] = {}
    for key, value in overrides.items():
        if key == "base_url":
            parts = urlsplit(value)
            update.update(host=parts.hostname, port=parts.port)
        elif key == "secret":
            update["password"] = SecretStr(value)
        elif key == "sender":
            update["from_email"] = value
    return settings.model_copy(update={"smtp": settings.smtp.model_copy(update=update)})


@dataclass(frozen=True)
class SmtpAnswer:
    """A raw SMTP reply, shaped like the HTTP answers the suite compares."""

    status_code: int
    body: dict[str, Any]

    def json(self) -> dict[str, Any]:
        return self.body


async def smtp_session(settings: Settings) -> aiosmtplib.SMTP:
    """An independent, connected (not authenticated) SMTP client."""
    s = settings.smtp
    client = aiosmtplib.SMTP(hostname=s.host, port=s.port, start_tls=False,
                             local_hostname="contract.test", timeout=10)
    await client.connect()
    return client


async def _smtp_unauthorized(settings: Settings) -> SmtpAnswer:
    assert settings.smtp.username is not None
    client = await smtp_session(settings)
    try:
        await client.login(settings.smtp.username, "not-the-password")
    except aiosmtplib.SMTPAuthenticationError as exc:
        return SmtpAnswer(exc.code, {"message": exc.message})
    finally:
        client.close()
    raise AssertionError("the SMTP emulator accepted a wrong password")


SMTP = Harness(
    name="smtp",
    sender=("billing@acme.example", "header_from", "billing@acme.example"),
    admin="smtp",
    channel=Channel.EMAIL,
    recipients={"ok": "ada@example.com", "bounce": "nobody@bounce.example.com",
                "syntax": "x@invalid.example.com", "disabled": "old@disabled.example.com"},
    rejections=(Rejection("bounce", "invalid_recipient", deactivate=True),
                Rejection("syntax", "invalid_recipient"),
                Rejection("disabled", "mailbox_disabled", deactivate=True)),
    configure=_smtp_configure,
    open=opener(SmtpEmail),
    unauthorized=_smtp_unauthorized,
    unauthorized_body={"message": "5.7.8 Authentication credentials invalid"},
    wrong_secret=lambda: "wrong-" + "x" * 12,
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    unauthorized_records=(),
    provider_message_id=re.compile(r"[0-9A-F]{12}"),
    empty_body_rule=None,
    retry_after=False,
    unauthorized_status=535,
    http=False,
)

# Slack and Teams (chat webhooks: the recipient is the URL, there is no account secret) ----------


class WebhookUrls(Mapping[str, str]):
    """Scenario → webhook URL at the emulator under this session's ``{section}``'s first
    prefix (read when a test asks: the fakes' port is the session's)."""

    def __init__(self, section: str, paths: Mapping[str, str]) -> None:
        self.section, self.paths = section, paths

    prefixes: dict[str, str] = {}

    def __getitem__(self, scenario: str) -> str:
        if self.section not in self.prefixes:
            self.prefixes[self.section] = getattr(Settings(), self.section).webhook_prefixes[0]
        return self.prefixes[self.section] + self.paths[scenario]

    def __iter__(self) -> Any:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


def chat_configure(section: str, path: str) -> Callable[[Settings, Overrides], Settings]:
    """``base_url`` moves the section's prefix to another origin; nothing else applies."""

    def configure(settings: Settings, overrides: Overrides) -> Settings:
        if "base_url" not in overrides:
            return settings
        config = getattr(settings, section).model_copy(
            update={"webhook_prefixes": (f"{overrides['base_url']}{path}",)})
        return settings.model_copy(update={section: config})

    return configure


def rebase(recipient: Recipient, base: str) -> Recipient:
    """``recipient`` (a webhook URL) at another origin, same path."""
    assert isinstance(recipient, str)
    return base + urlsplit(recipient).path


async def _no_credentials(settings: Settings) -> httpx.Response:
    raise AssertionError("a chat webhook has no account credentials")


CHAT_COMMON: dict[str, Any] = dict(
    channel=Channel.CHAT, unauthorized=_no_credentials, unauthorized_body={},
    wrong_secret=lambda: "", auth_rule=(Outcome.PERMANENT, "invalid_recipient"),
    unauthorized_records=(), empty_body_rule=None, credentials=False, rebase=rebase)

SLACK = Harness(
    name="slack", admin="slack",
    recipients=WebhookUrls("slack", {
        "ok": "T0001/B0001/okToken", "revoked": "T0001/B0002/revokedToken",
        "gone": "T0001/B0003/goneToken", "archived": "T0001/B0004/archivedToken",
        "prohibited": "T0001/B0005/prohibitedToken"}),
    rejections=(Rejection("revoked", "invalid_recipient", deactivate=True),
                Rejection("gone", "invalid_recipient", deactivate=True),
                Rejection("archived", "invalid_recipient", deactivate=True),
                Rejection("prohibited", "forbidden")),
    configure=chat_configure("slack", "/slack/services/"), open=opener(SlackWebhook),
    provider_message_id=re.compile(r"[0-9a-f]{32}:[0-9]+"), **CHAT_COMMON)

TEAMS = Harness(
    name="teams", admin="teams",
    recipients=WebhookUrls("teams", {
        "ok": "a1b2/triggers/manual/paths/invoke?api-version=1&sig=okSig",
        "gone": "a1b2/triggers/manual/paths/goneFlow",
        "unauthorized": "a1b2/triggers/manual/paths/unauthorizedFlow"}),
    rejections=(Rejection("gone", "invalid_recipient", deactivate=True),
                Rejection("unauthorized", "invalid_recipient", deactivate=True)),
    configure=chat_configure("teams", "/teams/workflows/"), open=opener(TeamsWebhook),
    provider_message_id=re.compile(r"[0-9a-f]{32}:[0-9]+"), **CHAT_COMMON)

HARNESSES = [TWILIO, SENDGRID, SES, FCM, APNS, VONAGE, SMTP, SLACK, TEAMS]
HTTP_HARNESSES = [h for h in HARNESSES if h.http]
CALLBACK_HARNESSES = [h for h in HARNESSES if h.callbacks is not None]
REJECTIONS = [(h, r) for h in HARNESSES for r in h.rejections]


def _ids(value: object) -> str:
    if isinstance(value, Harness):
        return value.name
    if isinstance(value, Rejection):
        return value.scenario
    return str(value)


# emulator admin and callback receivers -------------------------------------------------------


@dataclass
class Emulator:
    """The admin API of one emulator in ``notiflow fakes``."""

    base: str
    admin: str
    http: httpx.AsyncClient

    async def configure(self, **knobs: Any) -> dict[str, Any]:
        r = await self.http.post(f"{self.base}/_admin/{self.admin}/config", json=knobs)
        r.raise_for_status()
        return dict(r.json())

    async def config(self) -> dict[str, Any]:
        return dict((await self.http.get(f"{self.base}/_admin/{self.admin}/config")).json())

    async def records(self, message_id: str) -> list[dict[str, Any]]:
        r = await self.http.get(f"{self.base}/_admin/{self.admin}/messages",
                                params={"message_id": message_id})
        r.raise_for_status()
        return list(r.json())

    async def stats(self) -> dict[str, Any]:
        r = await self.http.get(f"{self.base}/_admin/{self.admin}/stats")
        r.raise_for_status()
        return dict(r.json())

    async def reset(self) -> None:
        (await self.http.post(f"{self.base}/_admin/reset")).raise_for_status()


T = TypeVar("T")


async def first_found(arrived: asyncio.Event, find: Callable[[], list[T]], count: int,
                      timeout: float) -> list[T]:
    """The first ``count`` items ``find`` returns, re-checked whenever ``arrived`` is set, for at
    most ``timeout`` seconds."""

    async def until() -> list[T]:
        while True:
            found = find()
            if len(found) >= count:
                return found[:count]
            arrived.clear()
            await arrived.wait()

    return await asyncio.wait_for(until(), timeout)


@dataclass
class Callback:
    url: str
    params: dict[str, str]
    headers: dict[str, str]


@dataclass
class Receiver:
    """A loopback webhook receiver that records every form callback, answering 200."""

    url: str
    calls: list[Callback] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        form = await request.post()
        self.calls.append(Callback(str(request.url), {k: str(v) for k, v in form.items()},
                                   dict(request.headers)))
        self.arrived.set()
        return web.Response(status=200)

    async def wait(self, message_id: str, count: int, timeout: float = 10.0) -> list[Callback]:
        """The first ``count`` callbacks whose URL names ``message_id``."""
        return await first_found(
            self.arrived, lambda: [c for c in self.calls if f"message_id={message_id}" in c.url],
            count, timeout)


@dataclass
class EventPost:
    body: bytes
    headers: dict[str, str]

    @property
    def events(self) -> list[dict[str, Any]]:
        return list(orjson.loads(self.body))


@dataclass
class EventReceiver:
    """A loopback Event Webhook receiver (JSON arrays), answering 200."""

    url: str
    posts: list[EventPost] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        self.posts.append(EventPost(await request.read(), dict(request.headers)))
        self.arrived.set()
        return web.Response(status=200)

    async def wait(self, message_id: str, count: int,
                   timeout: float = 10.0) -> list[dict[str, Any]]:
        """The first ``count`` events whose ``message_id`` custom arg is ``message_id``."""
        return await first_found(
            self.arrived, lambda: [e for p in self.posts for e in p.events
                                   if e.get("message_id") == message_id], count, timeout)


async def _serve(path: str, handler: Callable[[web.Request], Awaitable[web.Response]],
                 method: str = "POST") -> tuple[str, web.AppRunner]:
    port = free_port()
    app = web.Application()
    app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}{path}", runner


@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver("")
    rec.url, runner = await _serve("/hooks/sms", rec.handle)
    yield rec
    await runner.cleanup()


@pytest.fixture(scope="module")
async def event_receiver() -> AsyncIterator[EventReceiver]:
    rec = EventReceiver("")
    rec.url, runner = await _serve("/hooks/email", rec.handle)
    yield rec
    await runner.cleanup()


@pytest.fixture(params=HARNESSES, ids=_ids)
def harness(request: pytest.FixtureRequest) -> Harness:
    harness: Harness = request.param
    return harness


@pytest.fixture
async def emulator(fakes: str, harness: Harness) -> AsyncIterator[Emulator]:
    async with httpx.AsyncClient(timeout=30) as http:
        emu = Emulator(fakes, harness.admin, http)
        await emu.reset()
        yield emu
        await emu.reset()


@pytest.fixture
def provider_settings(settings: Settings, harness: Harness, receiver: Receiver) -> Settings:
    """The session's provider settings, with SMS callbacks sent to this module's receiver."""
    return harness.configure(settings, {"callback_url": receiver.url})


@pytest.fixture
async def adapter(harness: Harness, provider_settings: Settings,
                  emulator: Emulator) -> AsyncIterator[TimedClient]:
    client = await harness.open(provider_settings, 5.0)
    yield client
    await client.aclose()


def message(harness: Harness, scenario: str = "ok", body: str = "Your code is 123456", *,
            attempt: int = 1, message_id: str | None = None, tier: Tier = Tier.P0,
            recipient: Recipient | None = None, subject: str | None = "Your code",
            sender: str | None = None) -> OutboundMessage:
    return OutboundMessage(
        message_id=message_id or uuid.uuid4().hex, attempt=attempt, tenant_id="acme",
        channel=harness.channel, tier=tier,
        recipient=recipient if recipient is not None else harness.recipients[scenario],
        body=body, subject=subject if harness.channel is not Channel.SMS else None,
        sender=sender)


async def send_once(harness: Harness, settings: Settings, msg: OutboundMessage, *,
                    timeout: float = 5.0, call_timeout: float | None = None) -> SendResult:
    """Send ``msg`` with a client of its own, opened on ``settings`` with ``timeout``."""
    client = await harness.open(settings, timeout)
    try:
        return await client.send(msg, timeout=call_timeout)
    finally:
        await client.aclose()


def assert_result(result: SendResult, outcome: Outcome, reason: str | None) -> None:
    assert (result.outcome, result.reason) == (outcome, reason), result
    assert result.started_at <= result.completed_at


# the contract (every harness) ----------------------------------------------------------------


async def test_accepted(harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    msg = message(harness, attempt=2)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    assert result.provider_message_id is not None
    assert harness.provider_message_id.fullmatch(result.provider_message_id)
    assert result.provider_id == adapter.provider_id
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] == "accepted"
    assert record["sid"] == result.provider_message_id
    assert (record["attempt"], record["to"], record["body"]) == (
        2, harness.recorded(msg.recipient), msg.body)


@pytest.mark.parametrize("harness", [h for h in HARNESSES if h.sender], ids=_ids)
async def test_a_messages_own_sender_is_what_the_recipient_sees(
        harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    assert harness.sender is not None
    named, field, shown = harness.sender
    own = message(harness)
    msg = message(harness, sender=named)
    for m in (own, msg):
        assert_result(await adapter.send(m), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert record[field] == shown
    [default] = await emulator.records(own.message_id)
    assert default[field] not in (None, shown)


@pytest.mark.parametrize(("harness", "rejection"), REJECTIONS, ids=_ids)
async def test_recipient_rejected_permanently(harness: Harness, rejection: Rejection,
                                              adapter: TimedClient,
                                              emulator: Emulator) -> None:
    msg = message(harness, rejection.scenario)
    result = await adapter.send(msg)
    assert_result(result, Outcome.PERMANENT, rejection.reason)
    assert result.deactivate_recipient is rejection.deactivate
    assert result.provider_message_id is None
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] != "accepted"


async def test_empty_body(harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    result = await adapter.send(message(harness, body=""))
    if harness.empty_body_rule is None:
        assert_result(result, Outcome.ACCEPTED, None)
    else:
        assert_result(result, *harness.empty_body_rule)


@pytest.mark.parametrize("harness", [h for h in HARNESSES if h.credentials], ids=_ids)
async def test_wrong_credentials(harness: Harness, provider_settings: Settings,
                                 emulator: Emulator) -> None:
    raw = await harness.unauthorized(provider_settings)
    assert raw.status_code == harness.unauthorized_status
    assert raw.json() == dict(harness.unauthorized_body)
    wrong = harness.configure(provider_settings, {"secret": harness.wrong_secret()})
    msg = message(harness)
    result = await send_once(harness, wrong, msg)
    assert_result(result, *harness.auth_rule)
    assert result.deactivate_recipient is False
    records = await emulator.records(msg.message_id)
    assert [r["outcome"] for r in records] == list(harness.unauthorized_records)


async def test_rate_limited_honours_retry_after(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator) -> None:
    knobs: dict[str, Any] = {"error_rate_429": 1.0}
    if harness.retry_after:
        knobs["retry_after_s"] = 7
    await emulator.configure(**knobs)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.TRANSIENT, "rate_limited")
    if not harness.retry_after:
        assert result.retry_after_s is None
        return
    assert result.retry_after_s is not None
    if harness.exact_retry_after:
        assert result.retry_after_s == 7.0
    else:
        assert abs(result.retry_after_s - 7.0) <= 1.0


@pytest.mark.parametrize("harness", HTTP_HARNESSES, ids=_ids)
@pytest.mark.parametrize(("status", "outcome"), [(503, Outcome.TRANSIENT),
                                                 (500, Outcome.AMBIGUOUS)])
async def test_server_errors(harness: Harness, adapter: TimedClient, emulator: Emulator,
                             status: int, outcome: Outcome) -> None:
    await emulator.configure(error_rate_5xx=1.0, statuses_5xx=[status])
    for _ in range(3):
        result = await adapter.send(message(harness))
        assert_result(result, outcome, "server_error")
        assert result.provider_message_id is None
    assert (await emulator.stats())["accepted"] == 0


async def test_outage_is_transient(harness: Harness, adapter: TimedClient,
                                   emulator: Emulator) -> None:
    await emulator.configure(outage=True)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.TRANSIENT, "server_error")
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"]) == (1, 0)


async def test_accepted_then_timeout_is_ambiguous(harness: Harness, provider_settings: Settings,
                                                  emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=3.0)
    msg = message(harness)
    result = await send_once(harness, provider_settings, msg, timeout=0.4)
    assert_result(result, Outcome.AMBIGUOUS, "timeout")
    assert result.provider_message_id is None
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["hung"]) == (1, 1, 1)
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] == "accepted" and record["hang"] is True


async def test_per_call_timeout_override(harness: Harness, provider_settings: Settings,
                                         emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=3.0)
    result = await send_once(harness, provider_settings, message(harness), timeout=10.0,
                             call_timeout=0.3)
    assert_result(result, Outcome.AMBIGUOUS, "timeout")
    assert (result.completed_at - result.started_at).total_seconds() < 2.0


async def test_connection_refused_is_transient(harness: Harness, provider_settings: Settings,
                                               emulator: Emulator) -> None:
    base = f"http://127.0.0.1:{free_port()}"
    dead = harness.configure(provider_settings, {"base_url": base})
    msg = message(harness) if harness.rebase is None else message(
        harness, recipient=harness.rebase(harness.recipients["ok"], base))
    result = await send_once(harness, dead, msg, timeout=2.0)
    assert_result(result, Outcome.TRANSIENT, "connect_error")
    assert (await emulator.stats())["received"] == 0


async def test_latency_knob(harness: Harness, adapter: TimedClient, emulator: Emulator) -> None:
    await emulator.configure(latency_ms=200, latency_jitter_ms=0)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.ACCEPTED, None)
    assert (result.completed_at - result.started_at).total_seconds() >= 0.19


async def test_duplicates_are_counted(harness: Harness, adapter: TimedClient,
                                      emulator: Emulator) -> None:
    msg = message(harness)
    for _ in range(2):
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    await adapter.send(message(harness))
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["duplicates"]) == (3, 3, 1)
    assert stats["by_message_id"] == {"distinct": 2, "accepted_histogram": {"1": 1, "2": 1}}


async def test_retention_is_bounded(harness: Harness, adapter: TimedClient,
                                    emulator: Emulator) -> None:
    await emulator.configure(max_records=2)
    first, second = message(harness), message(harness)
    for msg in (first, second, second):
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["retained"]) == (3, 3, 2)
    assert stats["duplicates"] == 1
    assert stats["by_message_id"] == {"distinct": 1, "accepted_histogram": {"2": 1}}
    assert await emulator.records(first.message_id) == []


async def test_knobs_round_trip(emulator: Emulator) -> None:
    defaults = await emulator.config()
    changed = await emulator.configure(latency_ms=5, error_rate_429=0.5)
    assert (changed["latency_ms"], changed["error_rate_429"]) == (5, 0.5)
    assert await emulator.config() == changed
    bad = await emulator.http.post(f"{emulator.base}/_admin/{emulator.admin}/config",
                                   json={"error_rate_5xx": 2})
    assert bad.status_code == 400
    unknown = await emulator.http.post(f"{emulator.base}/_admin/{emulator.admin}/config",
                                       json={"no_such_knob": 1})
    assert unknown.status_code == 400
    assert await emulator.config() == changed
    await emulator.reset()
    assert await emulator.config() == defaults


async def test_reset_clears_every_emulator(fakes: str, settings: Settings) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        emulators = [Emulator(fakes, h.admin, http) for h in HARNESSES]
        for emu in emulators:
            await emu.configure(latency_ms=1)
        await emulators[0].reset()
        for emu in emulators:
            assert (await emu.config())["latency_ms"] == 0


# per-message status callbacks (Twilio style) ---------------------------------------------------


@pytest.mark.parametrize("harness", CALLBACK_HARNESSES, ids=_ids)
async def test_status_callbacks_are_signed(harness: Harness, adapter: TimedClient,
                                           emulator: Emulator, receiver: Receiver,
                                           provider_settings: Settings) -> None:
    spec = harness.callbacks
    assert spec is not None
    await emulator.configure(callback_delay_ms=10)
    msg = message(harness, attempt=3)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    calls = await receiver.wait(msg.message_id, 2)
    secret = spec.secret(provider_settings)
    for call in calls:
        assert f"attempt={msg.attempt}" in call.url
        assert call.params[spec.message_id_field] == result.provider_message_id
        assert spec.verify(secret, call.url, call.params, call.headers)
        tampered = {**call.params, spec.status_field: "read"}
        assert not spec.verify(secret, call.url, tampered, call.headers)
        assert not spec.verify("wrong", call.url, call.params, call.headers)
    assert {c.params[spec.status_field] for c in calls} == {"sent", spec.final_statuses[0]}


@pytest.mark.parametrize("harness", CALLBACK_HARNESSES, ids=_ids)
async def test_undelivered_callback_carries_error(harness: Harness, adapter: TimedClient,
                                                  emulator: Emulator,
                                                  receiver: Receiver) -> None:
    spec = harness.callbacks
    assert spec is not None
    await emulator.configure(callback_delay_ms=10, undelivered_rate=1.0)
    msg = message(harness)
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    calls = await receiver.wait(msg.message_id, 2)
    final = [c for c in calls if c.params[spec.status_field] != "sent"]
    assert [c.params[spec.status_field] for c in final] == [spec.final_statuses[1]]
    assert final[0].params[spec.error_field]


@pytest.mark.parametrize("harness", CALLBACK_HARNESSES, ids=_ids)
async def test_callback_failures_never_break_the_emulator(harness: Harness,
                                                          provider_settings: Settings,
                                                          emulator: Emulator) -> None:
    await emulator.configure(callback_delay_ms=0)
    dead = harness.configure(provider_settings,
                             {"callback_url": f"http://127.0.0.1:{free_port()}/gone"})
    client = await harness.open(dead, 5.0)
    try:
        for _ in range(3):
            assert_result(await client.send(message(harness)), Outcome.ACCEPTED, None)

        async def failed() -> int:
            while (n := (await emulator.stats())["callbacks"]["failed"]) < 6:
                await asyncio.sleep(0.05)
            return int(n)

        assert await asyncio.wait_for(failed(), 10) == 6
        assert_result(await client.send(message(harness)), Outcome.ACCEPTED, None)
    finally:
        await client.aclose()
    health = await emulator.http.get(f"{emulator.base}/_admin/health")
    assert health.status_code == 200


def test_twilio_signature_matches_documented_example() -> None:
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
              "From": "+12349013030", "To": "+18005551212"}
    assert signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    assert twilio_documented_signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


# SendGrid --------------------------------------------------------------------------------------


def sendgrid_documented_verify(public_key_b64: str, payload: bytes, signature_b64: str,
                               timestamp: str) -> bool:
    """SendGrid's documented check (ECDSA P-256 / SHA-256 over timestamp + raw body, key as
    base64 DER), written independently of the code under test."""
    key = serialization.load_der_public_key(base64.b64decode(public_key_b64))
    assert isinstance(key, ec.EllipticCurvePublicKey)
    try:
        key.verify(base64.b64decode(signature_b64), timestamp.encode() + payload,
                   ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


@pytest.mark.parametrize("harness", [SENDGRID], ids=_ids)
async def test_sendgrid_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                    provider_settings: Settings) -> None:
    msg = message(harness, subject="Your receipt")
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["subject"], record["from"], record["status"]) == (
        "Your receipt", provider_settings.sendgrid.from_email, 202)


@pytest.mark.parametrize("harness", [SENDGRID], ids=_ids)
async def test_sendgrid_missing_subject_is_permanent(harness: Harness, adapter: TimedClient,
                                                     emulator: Emulator) -> None:
    result = await adapter.send(message(harness, subject=None))
    assert_result(result, Outcome.PERMANENT, "invalid_content")
    assert result.error_code == "http_400:subject"


@pytest.mark.parametrize("harness", [SENDGRID], ids=_ids)
async def test_sendgrid_unverified_sender_is_misconfiguration(harness: Harness,
                                                              provider_settings: Settings,
                                                              emulator: Emulator) -> None:
    wrong = harness.configure(provider_settings, {"sender": "noreply@unverified.example.com"})
    result = await send_once(harness, wrong, message(harness))
    assert_result(result, Outcome.TRANSIENT, "misconfigured")
    assert result.error_code == "http_403:from"


@pytest.mark.parametrize("harness", [SENDGRID], ids=_ids)
async def test_sendgrid_events_are_off_by_default(harness: Harness, adapter: TimedClient,
                                                  emulator: Emulator) -> None:
    assert (await emulator.config())["callbacks_enabled"] is False
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    assert (await emulator.stats())["callbacks"]["scheduled"] == 0


@pytest.mark.parametrize("harness", [SENDGRID], ids=_ids)
async def test_sendgrid_event_webhook_is_signed(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator,
                                                event_receiver: EventReceiver,
                                                provider_settings: Settings) -> None:
    public_key = provider_settings.sendgrid.event_webhook_public_key
    assert public_key is not None
    key = await emulator.http.get(f"{emulator.base}/_admin/sendgrid/event-webhook-key")
    assert key.json() == {"public_key": public_key}
    await emulator.configure(callbacks_enabled=True, callback_delay_ms=10,
                             event_webhook_url=event_receiver.url)
    msg = message(harness, attempt=3)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    events = await event_receiver.wait(msg.message_id, 2)
    assert [e["event"] for e in events] == ["processed", "delivered"]
    for event in events:
        assert event["attempt"] == "3" and event["email"] == msg.recipient
        assert event["sg_message_id"].startswith(f"{result.provider_message_id}.")
    assert len({e["sg_event_id"] for e in events}) == 2
    posts = [p for p in event_receiver.posts
             if any(e.get("message_id") == msg.message_id for e in p.events)]
    for post in posts:
        sig = post.headers["X-Twilio-Email-Event-Webhook-Signature"]
        ts = post.headers["X-Twilio-Email-Event-Webhook-Timestamp"]
        assert abs(int(ts) - time.time()) < 60
        assert post.body.endswith(b"\r\n")
        assert sendgrid_documented_verify(public_key, post.body, sig, ts)
        assert not sendgrid_documented_verify(public_key, post.body + b" ", sig, ts)
        assert not sendgrid_documented_verify(public_key, post.body, sig, str(int(ts) + 1))


@pytest.mark.parametrize("harness", [SENDGRID], ids=_ids)
async def test_sendgrid_bounce_event(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                     event_receiver: EventReceiver) -> None:
    await emulator.configure(callbacks_enabled=True, callback_delay_ms=10,
                             event_webhook_url=event_receiver.url)
    msg = message(harness, recipient="grace@bounce.example.com")
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    processed, bounce = await event_receiver.wait(msg.message_id, 2)
    assert processed["event"] == "processed"
    assert (bounce["event"], bounce["type"], bounce["status"]) == ("bounce", "bounce", "5.1.1")


# FCM -------------------------------------------------------------------------------------------

SHORT_LIVED = ("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
               "timeframe. Check your iat and exp values in the JWT claim.")


async def _exchange(settings: Settings, assertion: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(settings.fcm.token_uri, data={
            "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
            "assertion": assertion})


def _rs256(claims: dict[str, Any], key: rsa.RSAPrivateKey) -> str:
    return jwt.encode(claims, key, algorithm="RS256")


def _claims(settings: Settings, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": settings.fcm.client_email,
            "scope": "https://www.googleapis.com/auth/firebase.messaging",
            "aud": settings.fcm.token_uri, "iat": now, "exp": now + 3600, **changes}


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_token_endpoint_checks_the_assertion(harness: Harness,
                                                       provider_settings: Settings,
                                                       emulator: Emulator) -> None:
    account = ServiceAccount.from_settings(provider_settings.fcm)
    key = account.private_key
    now = int(time.time())
    good = await _exchange(provider_settings, _rs256(_claims(provider_settings), key))
    assert good.status_code == 200
    assert good.json()["token_type"] == "Bearer" and good.json()["expires_in"] == 3599
    expired = await _exchange(provider_settings, _rs256(
        _claims(provider_settings, iat=now - 7200, exp=now - 3600), key))
    assert expired.status_code == 400
    assert expired.json() == {"error": "invalid_grant", "error_description": SHORT_LIVED}
    too_long = await _exchange(provider_settings, _rs256(
        _claims(provider_settings, exp=now + 7200), key))
    assert too_long.json()["error_description"] == SHORT_LIVED
    audience = await _exchange(provider_settings, _rs256(
        _claims(provider_settings, aud="https://example.com/token"), key))
    assert audience.json() == {"error": "invalid_grant",
                               "error_description": "Invalid JWT: Failed audience check."}
    other_key = serialization.load_pem_private_key(_rsa_pem().encode(), password=None)
    assert isinstance(other_key, rsa.RSAPrivateKey)
    forged = await _exchange(provider_settings, _rs256(_claims(provider_settings), other_key))
    assert (forged.status_code, forged.json()) == (
        400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
    stats = (await emulator.stats())["token"]
    assert (stats["requests"], stats["issued"], stats["rejected"]) == (5, 1, 4)


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_access_token_is_cached(harness: Harness, adapter: TimedClient,
                                          emulator: Emulator) -> None:
    for _ in range(3):
        assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    assert (await emulator.stats())["token"]["requests"] == 1
    assert isinstance(adapter, FcmPush) and adapter.tokens.exchanges == 1


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_cold_start_shares_one_exchange(harness: Harness, adapter: TimedClient,
                                                  emulator: Emulator) -> None:
    results = await asyncio.gather(*(adapter.send(message(harness)) for _ in range(20)))
    assert {r.outcome for r in results} == {Outcome.ACCEPTED}
    assert (await emulator.stats())["token"]["requests"] == 1


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_401_refreshes_the_token_once(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator) -> None:
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    revoked = await emulator.http.post(f"{emulator.base}/_admin/fcm/revoke-tokens")
    assert revoked.json() == {"revoked": 1}
    msg = message(harness)
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    assert [r["outcome"] for r in await emulator.records(msg.message_id)] == [
        "unauthorized", "accepted"]
    assert (await emulator.stats())["token"]["requests"] == 2


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_persistent_401_is_auth_failed(harness: Harness, provider_settings: Settings,
                                                 emulator: Emulator) -> None:
    async def bogus(_assertion: str, _timeout: float) -> tuple[str, float]:
        return "ya29.revoked", 3600.0

    account = ServiceAccount.from_settings(provider_settings.fcm)
    tokens = AccessTokens(account, bogus)
    client = await FcmPush.open(provider_settings, timeout=5.0)
    client.tokens = tokens
    try:
        msg = message(harness)
        result = await client.send(msg)
    finally:
        await client.aclose()
    assert_result(result, Outcome.TRANSIENT, "auth_failed")
    assert result.error_code == "UNAUTHENTICATED"
    assert tokens.exchanges == 2
    assert [r["outcome"] for r in await emulator.records(msg.message_id)] == [
        "unauthorized", "unauthorized"]


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_third_party_auth_error_is_not_a_token_problem(harness: Harness,
                                                                 adapter: TimedClient,
                                                                 emulator: Emulator) -> None:
    msg = message(harness, recipient=device("thirdpartyauth", PushPlatform.WEB))
    result = await adapter.send(msg)
    assert_result(result, Outcome.TRANSIENT, "misconfigured")
    assert result.error_code == "THIRD_PARTY_AUTH_ERROR"
    assert len(await emulator.records(msg.message_id)) == 1
    assert (await emulator.stats())["token"]["requests"] == 1


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_ios_waits_for_apns(harness: Harness, adapter: TimedClient,
                                      emulator: Emulator) -> None:
    ios = PushRecipient(device_token="ab" * 32, platform=PushPlatform.IOS)
    result = await adapter.send(message(harness, recipient=ios))
    assert_result(result, Outcome.TRANSIENT, "no_provider_for_platform")
    stats = await emulator.stats()
    assert (stats["received"], stats["token"]["requests"]) == (0, 0)


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_token_endpoint_outage_is_transient(harness: Harness, adapter: TimedClient,
                                                      emulator: Emulator) -> None:
    await emulator.configure(token_outage=True)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.TRANSIENT, "auth_unavailable")
    assert (await emulator.stats())["received"] == 0


@pytest.mark.parametrize("harness", [FCM], ids=_ids)
async def test_fcm_priority_follows_the_tier(harness: Harness, adapter: TimedClient,
                                             emulator: Emulator) -> None:
    cases = [(Tier.P0, device(), "HIGH"), (Tier.P3, device(), "NORMAL"),
             (Tier.P1, device(platform=PushPlatform.WEB), "high")]
    for tier, recipient, priority in cases:
        msg = message(harness, tier=tier, recipient=recipient)
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
        [record] = await emulator.records(msg.message_id)
        assert (record["priority"], record["title"]) == (priority, msg.subject)



# APNs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                provider_settings: Settings) -> None:
    cases = [(Tier.P0, "10"), (Tier.P1, "10"), (Tier.P3, "5")]
    for tier, priority in cases:
        msg = message(harness, tier=tier, attempt=2)
        before = int(time.time())
        result = await adapter.send(msg)
        assert_result(result, Outcome.ACCEPTED, None)
        assert result.provider_message_id == str(uuid.uuid5(
            uuid.uuid5(uuid.NAMESPACE_URL, "urn:notiflow:apns-id"), f"{msg.message_id}:2"))
        [record] = await emulator.records(msg.message_id)
        assert (record["priority"], record["push_type"], record["from"], record["title"],
                record["collapse_id"]) == (priority, "alert", provider_settings.apns.topic,
                                           msg.subject, msg.message_id)
        ttl = provider_settings.tier_ttl(tier).total_seconds()
        expiration = int(record["expiration"])
        assert expiration == 0 if tier is Tier.P0 else before + ttl <= expiration <= (
            time.time() + ttl)


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_emulator_checks_the_provider_token(harness: Harness,
                                                       provider_settings: Settings,
                                                       emulator: Emulator) -> None:
    a = provider_settings.apns
    assert a.team_id and a.key_id and a.private_key
    key = serialization.load_pem_private_key(a.private_key.get_secret_value().encode(),
                                             password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    now = datetime.now(UTC)
    url = f"{a.base_url}/3/device/{'ab' * 32}"
    body = b'{"aps": {"alert": "hi"}}'

    async def post(client: httpx.AsyncClient, token: str | None) -> httpx.Response:
        headers = apns_headers(provider_settings, token or "")
        if token is None:
            del headers["authorization"]
        response = await client.post(url, headers=headers, content=body)
        assert response.http_version == "HTTP/2"
        return response

    async with apns_http(provider_settings) as client:
        missing = await post(client, None)
        garbage = await post(client, "not.a.jwt")
        stale = await post(client, provider_token(a.team_id, a.key_id, key,
                                                  now - timedelta(minutes=61)))
        good = await post(client, provider_token(a.team_id, a.key_id, key,
                                                 now - timedelta(minutes=10)))
        newer = await post(client, provider_token(a.team_id, a.key_id, key, now))
    assert [(r.status_code, r.json()["reason"]) for r in (missing, garbage, stale)] == [
        (403, "MissingProviderToken"), (403, "InvalidProviderToken"),
        (403, "ExpiredProviderToken")]
    assert good.status_code == 200 and good.content == b""
    assert uuid.UUID(good.headers["apns-id"])
    assert (newer.status_code, newer.json()) == (429, {"reason": "TooManyProviderTokenUpdates"})
    assert "retry-after" not in newer.headers
    stats = await emulator.stats()
    assert stats["token"]["by_error"] == {"MissingProviderToken": 1, "InvalidProviderToken": 1,
                                          "ExpiredProviderToken": 1,
                                          "TooManyProviderTokenUpdates": 1}
    assert stats["connections"]["opened"] == 1


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_unregistered_carries_a_timestamp(harness: Harness,
                                                     provider_settings: Settings,
                                                     emulator: Emulator) -> None:
    a = provider_settings.apns
    assert a.team_id and a.key_id and a.private_key
    key = serialization.load_pem_private_key(a.private_key.get_secret_value().encode(),
                                             password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    token = provider_token(a.team_id, a.key_id, key, datetime.now(UTC))
    async with apns_http(provider_settings) as client:
        r = await client.post(f"{a.base_url}/3/device/{'0' * 64}",
                              headers=apns_headers(provider_settings, token),
                              content=b'{"aps": {"alert": "hi"}}')
    assert r.status_code == 410 and r.json()["reason"] == "Unregistered"
    assert abs(r.json()["timestamp"] / 1000 - time.time()) < 60


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_expired_provider_token_refreshes_once(harness: Harness,
                                                          adapter: TimedClient,
                                                          emulator: Emulator) -> None:
    assert isinstance(adapter, ApnsPush)
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    expired = await emulator.http.post(f"{emulator.base}/_admin/apns/expire-tokens")
    assert expired.json() == {"expired": 1}
    msg = message(harness)
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    assert [(r["outcome"], r["error"]) for r in await emulator.records(msg.message_id)] == [
        ("unauthorized", "ExpiredProviderToken"), ("accepted", None)]
    assert adapter.tokens.signed == 2
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    assert adapter.tokens.signed == 2

    await emulator.http.post(f"{emulator.base}/_admin/apns/expire-tokens")
    again = message(harness)
    result = await adapter.send(again)
    assert_result(result, Outcome.TRANSIENT, "auth_failed")
    assert result.error_code == "ExpiredProviderToken"
    assert adapter.tokens.signed == 2, "no second early refresh within 20 minutes"
    assert len(await emulator.records(again.message_id)) == 1


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_invalid_provider_token_is_not_retried(harness: Harness,
                                                          provider_settings: Settings,
                                                          emulator: Emulator) -> None:
    wrong = provider_settings.model_copy(update={
        "apns": provider_settings.apns.model_copy(update={"key_id": "WRONGKEY01"})})
    client = await ApnsPush.open(wrong, timeout=5.0)
    try:
        msg = message(harness)
        result = await client.send(msg)
    finally:
        await client.aclose()
    assert_result(result, Outcome.TRANSIENT, "auth_failed")
    assert (result.error_code, result.deactivate_recipient) == ("InvalidProviderToken", False)
    assert len(await emulator.records(msg.message_id)) == 1
    assert client.tokens.signed == 1


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_only_takes_ios_tokens(harness: Harness, adapter: TimedClient,
                                          emulator: Emulator) -> None:
    result = await adapter.send(message(harness, recipient=device()))
    assert_result(result, Outcome.TRANSIENT, "no_provider_for_platform")
    assert (await emulator.stats())["received"] == 0


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_500_concurrent_sends_share_one_connection(harness: Harness,
                                                              adapter: TimedClient,
                                                              emulator: Emulator) -> None:
    await emulator.configure(latency_ms=50)
    messages = [message(harness, recipient=ios_device()) for _ in range(500)]
    started = time.monotonic()
    results = await asyncio.gather(*(adapter.send(m) for m in messages))
    elapsed = time.monotonic() - started
    assert [r.outcome for r in results] == [Outcome.ACCEPTED] * 500
    assert len({r.provider_message_id for r in results}) == 500
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["duplicates"]) == (500, 500, 0)
    assert stats["connections"]["opened"] == 1
    assert elapsed < 5.0, "streams were multiplexed, not serialised (500 x 50 ms = 25 s)"


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_untrusted_certificate_is_connect_error(harness: Harness,
                                                           provider_settings: Settings,
                                                           emulator: Emulator) -> None:
    untrusted = provider_settings.model_copy(update={
        "apns": provider_settings.apns.model_copy(update={"ca_file": None})})
    result = await send_once(harness, untrusted, message(harness))
    assert_result(result, Outcome.TRANSIENT, "connect_error")
    assert (await emulator.stats())["received"] == 0


@pytest.mark.parametrize("harness", [APNS], ids=_ids)
async def test_apns_connection_lost_after_send_is_ambiguous(harness: Harness,
                                                            adapter: TimedClient,
                                                            emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=30.0)
    msg = message(harness)
    pending = asyncio.create_task(adapter.send(msg))
    while not await emulator.records(msg.message_id):
        await asyncio.sleep(0.02)
    dropped = await emulator.http.post(f"{emulator.base}/_admin/apns/drop-connections")
    assert dropped.json()["dropped"] >= 1
    result = await asyncio.wait_for(pending, 5.0)
    assert_result(result, Outcome.AMBIGUOUS, "connection_lost")
    assert result.error_code == "ConnectError:sent"
    await emulator.configure(timeout_rate=0.0)
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    assert (await emulator.stats())["connections"]["opened"] == 2


# Vonage ----------------------------------------------------------------------------------------


def vonage_documented_signature(secret: str, params: Mapping[str, str]) -> str:
    """Vonage's documented SHA-256 HMAC signature (every parameter but ``sig``, sorted by name,
    as ``&name=value`` with ``&`` and ``=`` in values replaced by ``_``; uppercase hex),
    written independently of the code under test."""
    data = ""
    for key in sorted(params):
        if key != "sig":
            data += "&" + key + "=" + params[key].replace("&", "_").replace("=", "_")
    return hmac.new(secret.encode(), data.encode(), hashlib.sha256).hexdigest().upper()


@dataclass
class Dlr:
    method: str
    content_type: str
    params: dict[str, str]


@dataclass
class DlrReceiver:
    """A loopback delivery-receipt receiver: GET query, form POST or JSON POST, answering 204
    as Vonage expects."""

    url: str
    receipts: list[Dlr] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        params = dict(request.query)
        raw = await request.read()
        if request.content_type == "application/json":
            params.update(orjson.loads(raw))
        elif raw:
            params.update(parse_qsl(raw.decode(), keep_blank_values=True))
        self.receipts.append(Dlr(request.method, request.content_type, params))
        self.arrived.set()
        return web.Response(status=204)

    async def wait(self, ref: str, count: int, timeout: float = 10.0) -> list[Dlr]:
        """The first ``count`` receipts whose ``client-ref`` is ``ref``."""
        return await first_found(
            self.arrived, lambda: [r for r in self.receipts if r.params.get("client-ref") == ref],
            count, timeout)


@pytest.fixture(scope="module")
async def dlr_receiver() -> AsyncIterator[DlrReceiver]:
    rec = DlrReceiver("")
    rec.url, runner = await _serve("/hooks/vonage", rec.handle, method="*")
    yield rec
    await runner.cleanup()


@pytest.mark.parametrize("harness", [VONAGE], ids=_ids)
async def test_vonage_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                  provider_settings: Settings) -> None:
    msg = message(harness, attempt=4)
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["client_ref"], record["type"], record["from"], record["parts"]) == (
        f"{msg.message_id}:4", "text", provider_settings.vonage.from_name, 1)
    unicode = message(harness, body="Ihr Code: 123456 ✓")
    assert_result(await adapter.send(unicode), Outcome.ACCEPTED, None)
    [record] = await emulator.records(unicode.message_id)
    assert record["type"] == "unicode"


@pytest.mark.parametrize("harness", [VONAGE], ids=_ids)
@pytest.mark.parametrize("method", ["GET", "POST", "POST-JSON"])
async def test_vonage_delivery_receipts_are_signed(harness: Harness, method: str,
                                                   provider_settings: Settings,
                                                   emulator: Emulator,
                                                   dlr_receiver: DlrReceiver) -> None:
    v = provider_settings.vonage
    assert v.signature_secret is not None and v.api_key
    secret = v.signature_secret.get_secret_value()
    await emulator.configure(callback_delay_ms=10, dlr_method=method)
    msg = message(harness, attempt=3, body="x" * 200)
    result = await send_once(
        harness, harness.configure(provider_settings, {"callback_url": dlr_receiver.url}), msg)
    assert_result(result, Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert record["parts"] == 2
    receipts = await dlr_receiver.wait(f"{msg.message_id}:3", 2)
    assert result.provider_message_id in {r.params["messageId"] for r in receipts}
    assert len({r.params["messageId"] for r in receipts}) == 2
    for receipt in receipts:
        p = receipt.params
        assert receipt.method == ("GET" if method == "GET" else "POST")
        assert (receipt.content_type == "application/json") is (method == "POST-JSON")
        assert (p["status"], p["err-code"], p["msisdn"], p["to"], p["api-key"]) == (
            "delivered", "0", "14155550100", v.from_name, v.api_key)
        assert re.fullmatch(r"\d{10}", p["scts"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", p["message-timestamp"])
        assert p["nonce"] and abs(int(p["timestamp"]) - time.time()) < 60
        assert p["sig"] == vonage_documented_signature(secret, p)
        assert verify_signature(secret, p)
        assert not verify_signature(secret, {**p, "status": "failed"})
        assert not verify_signature("wrong", p)


@pytest.mark.parametrize("harness", [VONAGE], ids=_ids)
async def test_vonage_failed_receipt(harness: Harness, provider_settings: Settings,
                                     emulator: Emulator, dlr_receiver: DlrReceiver) -> None:
    await emulator.configure(callback_delay_ms=10, undelivered_rate=1.0)
    msg = message(harness)
    assert_result(await send_once(harness, harness.configure(
        provider_settings, {"callback_url": dlr_receiver.url}), msg), Outcome.ACCEPTED, None)
    [receipt] = await dlr_receiver.wait(f"{msg.message_id}:1", 1)
    assert (receipt.params["status"], receipt.params["err-code"]) == ("failed", "1")


@pytest.mark.parametrize("harness", [VONAGE], ids=_ids)
@pytest.mark.parametrize(("status", "expected"), [
    ("1", (Outcome.TRANSIENT, "rate_limited")),
    ("5", (Outcome.TRANSIENT, "server_error")),
    ("8", (Outcome.TRANSIENT, "account_inactive")),
    ("9", (Outcome.TRANSIENT, "quota_exceeded")),
    ("12", (Outcome.PERMANENT, "invalid_content")),
    ("15", (Outcome.TRANSIENT, "misconfigured")),
])
async def test_vonage_documented_statuses(harness: Harness, adapter: TimedClient,
                                          emulator: Emulator, status: str,
                                          expected: tuple[Outcome, str]) -> None:
    msg = message(harness, recipient=f"+447700900{int(status):03d}")
    result = await adapter.send(msg)
    assert_result(result, *expected)
    assert result.error_code == status
    assert result.retry_after_s == (1.0 if status == "1" else None)
    [record] = await emulator.records(msg.message_id)
    assert (record["status"], record["error_code"]) == (200, int(status))


@pytest.mark.parametrize("harness", [VONAGE], ids=_ids)
async def test_vonage_signed_requests(harness: Harness, provider_settings: Settings,
                                      emulator: Emulator) -> None:
    v = provider_settings.vonage
    assert v.signature_secret is not None and v.api_secret is not None and v.api_key
    secret = v.signature_secret.get_secret_value()

    async def status_of(params: dict[str, str]) -> str:
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(f"{v.base_url}/sms/json", data=params)
        assert r.status_code == 200
        return str(r.json()["messages"][0]["status"])

    params = {"api_key": v.api_key, "from": v.from_name, "to": "14155550100", "text": "hi",
              "client-ref": "msg_signed:1", "timestamp": str(int(time.time()))}
    signed = {**params, "sig": vonage_documented_signature(secret, params)}
    assert await status_of(signed) == "0"
    assert await status_of({**signed, "api_secret": v.api_secret.get_secret_value()}) == "32"
    assert await status_of({**params, "sig": "0" * 64}) == "14"
    stale = {**params, "timestamp": str(int(time.time()) - 3600)}
    assert await status_of({**stale, "sig": vonage_documented_signature(secret, stale)}) == "14"
    assert await status_of({k: x for k, x in params.items() if k != "timestamp"}) == "2"


# SMTP ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
async def test_smtp_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                provider_settings: Settings) -> None:
    msg = message(harness, attempt=2, subject="Grüße aus Zürich",
                  body="Line one\n.dot line\nünïcödé")
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["subject"], record["body"]) == (msg.subject, msg.body)
    keys = CorrelationKeys.from_settings(provider_settings)
    assert record["from"] == bounce_address(keys, provider_settings.smtp.from_email,
                                            msg.message_id, 2)
    assert record["smtp_message_id"] == f"<{msg.message_id}.2@notiflow>"
    assert (record["stage"], record["status"], record["enhanced"]) == ("data_end", 250, "2.0.0")
    assert record["sid"] == result.provider_message_id


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
@pytest.mark.parametrize(("knob", "expected", "code", "stage"), [
    ("error_rate_421", (Outcome.TRANSIENT, "server_error", False), "421 4.3.0", "mail"),
    ("error_rate_429", (Outcome.TRANSIENT, "rate_limited", False), "451 4.7.1", "mail"),
    ("error_rate_452", (Outcome.TRANSIENT, "server_error", False), "452 4.3.1", "rcpt"),
    ("error_rate_550", (Outcome.PERMANENT, "invalid_recipient", True), "550 5.1.1", "rcpt"),
    ("error_rate_552", (Outcome.TRANSIENT, "mailbox_full", False), "552 5.2.2", "rcpt"),
    ("error_rate_451", (Outcome.TRANSIENT, "server_error", False), "451 4.3.0", "data_end"),
    ("error_rate_554", (Outcome.PERMANENT, "rejected", False), "554 5.7.1", "data_end"),
])
async def test_smtp_error_mix(harness: Harness, adapter: TimedClient, emulator: Emulator,
                              knob: str, expected: tuple[Outcome, str, bool], code: str,
                              stage: str) -> None:
    await emulator.configure(**{knob: 1.0})
    msg = message(harness)
    result = await adapter.send(msg)
    assert_result(result, expected[0], expected[1])
    assert (result.deactivate_recipient, result.error_code) == (expected[2], code)
    [record] = await emulator.records(msg.message_id)
    assert (record["stage"], record["outcome"] != "accepted") == (stage, True)
    await emulator.configure(**{knob: 0.0})
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
@pytest.mark.parametrize(("recipient", "expected", "code"), [
    ("kim@full.example.com", (Outcome.TRANSIENT, "mailbox_full"), "552 5.2.2"),
    ("kim@policy.example.com", (Outcome.PERMANENT, "rejected"), "554 5.7.1"),
])
async def test_smtp_magic_recipients(harness: Harness, adapter: TimedClient, emulator: Emulator,
                                     recipient: str, expected: tuple[Outcome, str],
                                     code: str) -> None:
    result = await adapter.send(message(harness, recipient=recipient))
    assert_result(result, *expected)
    assert result.error_code == code and result.deactivate_recipient is False


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
async def test_smtp_greylisting_passes_on_retry(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator) -> None:
    recipient = f"grey-{uuid.uuid4().hex[:8]}@greylist.example.com"
    msg = message(harness, recipient=recipient)
    first = await adapter.send(msg)
    assert_result(first, Outcome.TRANSIENT, "rate_limited")
    assert first.error_code == "451 4.7.1"
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    assert [r["outcome"] for r in await emulator.records(msg.message_id)] == [
        "rate_limited", "accepted"]


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
async def test_smtp_reuses_connections(harness: Harness, adapter: TimedClient,
                                       emulator: Emulator) -> None:
    for scenario in ("ok", "bounce", "ok", "ok"):
        await adapter.send(message(harness, scenario))
    assert isinstance(adapter, SmtpEmail)
    assert (adapter.stats.opened, adapter.stats.reused) == (1, 3)
    stats = await emulator.stats()
    assert (stats["connections"]["opened"], stats["auth"]["succeeded"]) == (1, 1)
    assert (stats["accepted"], stats["rejected"]) == (3, 1)


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
async def test_smtp_pooled_connection_refused_by_outage(harness: Harness, adapter: TimedClient,
                                                        emulator: Emulator) -> None:
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    await emulator.configure(outage=True)
    msg = message(harness)
    result = await adapter.send(msg)
    assert_result(result, Outcome.TRANSIENT, "server_error")
    assert isinstance(adapter, SmtpEmail) and adapter.stats.stale_retries == 1
    assert [(r["stage"], r["outcome"]) for r in await emulator.records(msg.message_id)] == [
        ("mail", "outage")]
    stats = await emulator.stats()
    assert (stats["received"], stats["connections"]["refused"]) == (3, 1)


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
async def test_smtp_requires_auth(harness: Harness, provider_settings: Settings,
                                  emulator: Emulator) -> None:
    client = await smtp_session(provider_settings)
    try:
        await client.ehlo()
        assert client.supports_extension("auth") and client.supports_extension("dsn")
        with pytest.raises(aiosmtplib.SMTPSenderRefused) as refused:
            await client.mail(provider_settings.smtp.from_email)
    finally:
        client.close()
    assert (refused.value.code, refused.value.message) == (
        530, "5.7.0 Authentication required")


@pytest.mark.parametrize("harness", [SMTP], ids=_ids)
async def test_smtp_envid_correlates_refused_recipients(harness: Harness, adapter: TimedClient,
                                                        emulator: Emulator) -> None:
    msg = message(harness, "bounce", attempt=7)
    await adapter.send(msg)
    [record] = await emulator.records(msg.message_id)
    assert (record["attempt"], record["stage"], record["enhanced"]) == (7, "rcpt", "5.1.1")
    assert record["to"] == msg.recipient and record["body"] is None


# SES -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("harness", [SES], ids=_ids)
async def test_ses_wire_format(harness: Harness, adapter: TimedClient, emulator: Emulator,
                               provider_settings: Settings) -> None:
    msg = message(harness, attempt=3, body="Grüße, your code is 1")
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    [record] = await emulator.records(msg.message_id)
    assert (record["to"], record["subject"], record["body"], record["attempt"]) == (
        "ada@example.com", "Your code", "Grüße, your code is 1", 3)
    assert record["from"] == provider_settings.ses.from_email
    assert record["tags"]["message_id"] == msg.message_id


@pytest.mark.parametrize("harness", [SES], ids=_ids)
async def test_ses_sdk_and_emulator_agree(harness: Harness, provider_settings: Settings,
                                          emulator: Emulator) -> None:
    """botocore's own ``sesv2`` client (the SDK: its serializer, SigV4 signer and error
    parser) against the emulator: accepted, and SES's error types read back as the SDK reads
    them, the ones :mod:`~notiflow.adapters.providers.ses.classify` keys on."""
    import botocore.session
    from botocore.exceptions import ClientError

    s = provider_settings.ses
    assert s.secret_access_key is not None
    client = botocore.session.get_session().create_client(
        "sesv2", region_name=s.region, endpoint_url=s.endpoint_url,
        aws_access_key_id=s.access_key_id,
        aws_secret_access_key=s.secret_access_key.get_secret_value())

    def send(to: str, sender: str = s.from_email) -> dict[str, Any]:
        return dict(client.send_email(
            FromEmailAddress=sender, Destination={"ToAddresses": [to]},
            Content={"Simple": {"Subject": {"Data": "Hi"}, "Body": {"Text": {"Data": "x"}}}},
            EmailTags=[{"Name": "message_id", "Value": "sdk-1"}]))

    accepted = await asyncio.to_thread(send, "ada@example.com")
    assert harness.provider_message_id.fullmatch(accepted["MessageId"])
    for to, sender, code in (("kim@reject.example.com", s.from_email, "MessageRejected"),
                             ("ada@example.com", "x@unverified.example.com",
                              "MessageRejected"),
                             ("not-an-address", s.from_email, "BadRequestException")):
        with pytest.raises(ClientError) as refused:
            await asyncio.to_thread(send, to, sender)
        assert refused.value.response["Error"]["Code"] == code
    [record] = [r for r in await emulator.records("sdk-1") if r["outcome"] == "accepted"]
    assert record["to"] == "ada@example.com"


@pytest.mark.parametrize("harness", [SES], ids=_ids)
async def test_ses_unverified_sender_is_misconfiguration(harness: Harness, adapter: TimedClient,
                                                         emulator: Emulator) -> None:
    msg = message(harness, sender="news@unverified.example.com")
    result = await adapter.send(msg)
    assert_result(result, Outcome.TRANSIENT, "misconfigured")
    assert result.error_code == "http_400:MessageRejected"
