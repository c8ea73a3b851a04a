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
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import orjson
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import SecretStr

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.fcm import (
    AccessTokens,
    FcmPush,
    ServiceAccount,
    sign_jwt,
)
from notiflow.adapters.providers.sendgrid import SendGridEmail
from notiflow.adapters.providers.twilio import TwilioSms, signature
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
    unauthorized: Callable[[Settings], Awaitable[httpx.Response]]
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
    callbacks: CallbackSpec | None = None


def recipient_text(recipient: Recipient) -> str:
    """What the emulator records as ``to``."""
    return recipient.device_token if isinstance(recipient, PushRecipient) else recipient


# Twilio --------------------------------------------------------------------------------------


def _twilio_configure(settings: Settings, overrides: Overrides) -> Settings:
    names = {"base_url": "base_url", "secret": "auth_token", "callback_url": "status_callback_url",
             "sender": "from_number"}
    update = {names[k]: SecretStr(v) if k == "secret" else v for k, v in overrides.items()}
    return settings.model_copy(update={"twilio": settings.twilio.model_copy(update=update)})


async def _twilio_open(settings: Settings, timeout: float) -> TimedClient:
    return await TwilioSms.open(settings, timeout=timeout)


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
    configure=_twilio_configure,
    open=_twilio_open,
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


def _sendgrid_configure(settings: Settings, overrides: Overrides) -> Settings:
    names = {"base_url": "base_url", "secret": "api_key", "sender": "from_email"}
    update = {names[k]: SecretStr(v) if k == "secret" else v for k, v in overrides.items()
              if k in names}
    return settings.model_copy(update={"sendgrid": settings.sendgrid.model_copy(update=update)})


async def _sendgrid_open(settings: Settings, timeout: float) -> TimedClient:
    return await SendGridEmail.open(settings, timeout=timeout)


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
    admin="sendgrid",
    channel=Channel.EMAIL,
    recipients={"ok": "ada@example.com", "invalid": "nobody@invalid.example.com",
                "malformed": "not-an-address"},
    rejections=(Rejection("invalid", "invalid_recipient"),
                Rejection("malformed", "invalid_recipient")),
    configure=_sendgrid_configure,
    open=_sendgrid_open,
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


# FCM -----------------------------------------------------------------------------------------


def _rsa_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _fcm_configure(settings: Settings, overrides: Overrides) -> Settings:
    names = {"base_url": "base_url", "secret": "private_key"}
    update = {names[k]: SecretStr(v) if k == "secret" else v for k, v in overrides.items()
              if k in names}
    return settings.model_copy(update={"fcm": settings.fcm.model_copy(update=update)})


async def _fcm_open(settings: Settings, timeout: float) -> TimedClient:
    return await FcmPush.open(settings, timeout=timeout)


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
    configure=_fcm_configure,
    open=_fcm_open,
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

HARNESSES = [TWILIO, SENDGRID, FCM]
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

        async def until() -> list[Callback]:
            while True:
                found = [c for c in self.calls if f"message_id={message_id}" in c.url]
                if len(found) >= count:
                    return found[:count]
                self.arrived.clear()
                await self.arrived.wait()

        return await asyncio.wait_for(until(), timeout)


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

        async def until() -> list[dict[str, Any]]:
            while True:
                found = [e for p in self.posts for e in p.events
                         if e.get("message_id") == message_id]
                if len(found) >= count:
                    return found[:count]
                self.arrived.clear()
                await self.arrived.wait()

        return await asyncio.wait_for(until(), timeout)


async def _serve(path: str, handler: Callable[[web.Request], Awaitable[web.Response]]
                 ) -> tuple[str, web.AppRunner]:
    port = free_port()
    app = web.Application()
    app.router.add_post(path, handler)
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
            recipient: Recipient | None = None,
            subject: str | None = "Your code") -> OutboundMessage:
    return OutboundMessage(
        message_id=message_id or uuid.uuid4().hex, attempt=attempt, tenant_id="acme",
        channel=harness.channel, tier=tier,
        recipient=recipient if recipient is not None else harness.recipients[scenario],
        body=body, subject=subject if harness.channel is not Channel.SMS else None)


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
        2, recipient_text(msg.recipient), msg.body)


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


async def test_wrong_credentials(harness: Harness, provider_settings: Settings,
                                 emulator: Emulator) -> None:
    raw = await harness.unauthorized(provider_settings)
    assert raw.status_code == 401
    assert raw.json() == dict(harness.unauthorized_body)
    wrong = harness.configure(provider_settings, {"secret": harness.wrong_secret()})
    client = await harness.open(wrong, 5.0)
    try:
        msg = message(harness)
        result = await client.send(msg)
    finally:
        await client.aclose()
    assert_result(result, *harness.auth_rule)
    assert result.deactivate_recipient is False
    records = await emulator.records(msg.message_id)
    assert [r["outcome"] for r in records] == list(harness.unauthorized_records)


async def test_rate_limited_honours_retry_after(harness: Harness, adapter: TimedClient,
                                                emulator: Emulator) -> None:
    await emulator.configure(error_rate_429=1.0, retry_after_s=7)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.TRANSIENT, "rate_limited")
    assert result.retry_after_s is not None
    if harness.exact_retry_after:
        assert result.retry_after_s == 7.0
    else:
        assert abs(result.retry_after_s - 7.0) <= 1.0


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
    client = await harness.open(provider_settings, 0.4)
    try:
        result = await client.send(msg)
    finally:
        await client.aclose()
    assert_result(result, Outcome.AMBIGUOUS, "timeout")
    assert result.provider_message_id is None
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["hung"]) == (1, 1, 1)
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] == "accepted" and record["hang"] is True


async def test_per_call_timeout_override(harness: Harness, provider_settings: Settings,
                                         emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=3.0)
    client = await harness.open(provider_settings, 10.0)
    try:
        result = await client.send(message(harness), timeout=0.3)
    finally:
        await client.aclose()
    assert_result(result, Outcome.AMBIGUOUS, "timeout")
    assert (result.completed_at - result.started_at).total_seconds() < 2.0


async def test_connection_refused_is_transient(harness: Harness, provider_settings: Settings,
                                               emulator: Emulator) -> None:
    dead = harness.configure(provider_settings, {"base_url": f"http://127.0.0.1:{free_port()}"})
    client = await harness.open(dead, 2.0)
    try:
        result = await client.send(message(harness))
    finally:
        await client.aclose()
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
    client = await harness.open(wrong, 5.0)
    try:
        result = await client.send(message(harness))
    finally:
        await client.aclose()
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
    good = await _exchange(provider_settings, sign_jwt(_claims(provider_settings), key))
    assert good.status_code == 200
    assert good.json()["token_type"] == "Bearer" and good.json()["expires_in"] == 3599
    expired = await _exchange(provider_settings, sign_jwt(
        _claims(provider_settings, iat=now - 7200, exp=now - 3600), key))
    assert expired.status_code == 400
    assert expired.json() == {"error": "invalid_grant", "error_description": SHORT_LIVED}
    too_long = await _exchange(provider_settings, sign_jwt(
        _claims(provider_settings, exp=now + 7200), key))
    assert too_long.json()["error_description"] == SHORT_LIVED
    audience = await _exchange(provider_settings, sign_jwt(
        _claims(provider_settings, aud="https://example.com/token"), key))
    assert audience.json() == {"error": "invalid_grant",
                               "error_description": "Invalid JWT: Failed audience check."}
    other_key = serialization.load_pem_private_key(_rsa_pem().encode(), password=None)
    assert isinstance(other_key, rsa.RSAPrivateKey)
    forged = await _exchange(provider_settings, sign_jwt(_claims(provider_settings), other_key))
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

