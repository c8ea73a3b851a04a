"""Contract suite: a real SMS adapter against its emulator in ``notiflow fakes``.

Each adapter is one :class:`SmsHarness` (how to build it, which recipients trigger which
provider answer, how its callbacks are signed); add a second SMS vendor by appending its harness
to ``HARNESSES``. Emulators share the knob names of ``docs/providers.md``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web
from pydantic import SecretStr

from notiflow.adapters.providers.base import OutboundMessage, Outcome, ProviderClient, SendResult
from notiflow.adapters.providers.twilio import TwilioSms, signature
from notiflow.devenv import free_port
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

pytestmark = pytest.mark.integration

Overrides = Mapping[str, Any]
"""Generic provider overrides: ``base_url``, ``secret``, ``callback_url``."""


@dataclass(frozen=True)
class SmsHarness:
    """What the contract suite needs to know about one SMS adapter and its emulator."""

    name: str
    admin: str
    """Path segment of the emulator's admin API (``/_admin/{admin}/...``)."""
    recipients: Mapping[str, str]
    """Scenario → recipient: ``ok``, ``invalid``, ``unsubscribed``, ``unreachable``,
    ``not_mobile``, ``region``."""
    configure: Callable[[Settings, Overrides], Settings]
    open: Callable[[Settings, float], Awaitable[ProviderClient]]
    unauthorized: Callable[[Settings], Awaitable[httpx.Response]]
    """A raw request with a wrong secret."""
    unauthorized_body: Mapping[str, Any]
    auth_rule: tuple[Outcome, str]
    provider_message_id: re.Pattern[str]
    verify_callback: Callable[[str, str, Mapping[str, str], Mapping[str, str]], bool]
    """(secret, url, form params, headers) → signature valid."""
    secret: Callable[[Settings], str]
    callback_message_id: str
    """Form field of a callback that carries the provider message id."""
    callback_status: str
    final_statuses: tuple[str, str] = ("delivered", "undelivered")
    callback_error_field: str = "ErrorCode"


def _twilio_configure(settings: Settings, overrides: Overrides) -> Settings:
    names = {"base_url": "base_url", "secret": "auth_token", "callback_url": "status_callback_url"}
    update = {names[k]: SecretStr(v) if k == "secret" else v for k, v in overrides.items()}
    return settings.model_copy(update={"twilio": settings.twilio.model_copy(update=update)})


async def _twilio_open(settings: Settings, timeout: float) -> ProviderClient:
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


TWILIO = SmsHarness(
    name="twilio",
    admin="twilio",
    recipients={"ok": "+14155550100", "invalid": "+15005550001",
                "unsubscribed": "+15005550004", "unreachable": "+15005550002",
                "not_mobile": "+15005550009", "region": "+15005550003"},
    configure=_twilio_configure,
    open=_twilio_open,
    unauthorized=_twilio_unauthorized,
    unauthorized_body={"code": 20003, "message": "Authenticate",
                       "more_info": "https://www.twilio.com/docs/errors/20003", "status": 401},
    auth_rule=(Outcome.TRANSIENT, "auth_failed"),
    provider_message_id=re.compile(r"SM[0-9a-f]{32}"),
    verify_callback=_twilio_verify,
    secret=_twilio_secret,
    callback_message_id="MessageSid",
    callback_status="MessageStatus",
)

HARNESSES = [TWILIO]


# emulator admin and callback receiver ------------------------------------------------------


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
    """A loopback webhook receiver that records every callback, answering 200."""

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


@pytest.fixture(scope="module")
async def receiver() -> AsyncIterator[Receiver]:
    port = free_port()
    app = web.Application()
    rec = Receiver(f"http://127.0.0.1:{port}/hooks/sms")
    app.router.add_post("/hooks/sms", rec.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield rec
    await runner.cleanup()


@pytest.fixture(params=HARNESSES, ids=lambda h: h.name)
def harness(request: pytest.FixtureRequest) -> SmsHarness:
    harness: SmsHarness = request.param
    return harness


@pytest.fixture
async def emulator(fakes: str, harness: SmsHarness) -> AsyncIterator[Emulator]:
    async with httpx.AsyncClient(timeout=30) as http:
        emu = Emulator(fakes, harness.admin, http)
        await emu.reset()
        yield emu
        await emu.reset()


@pytest.fixture
def provider_settings(settings: Settings, harness: SmsHarness, receiver: Receiver) -> Settings:
    """The session's provider settings, with callbacks sent to this module's receiver."""
    return harness.configure(settings, {"callback_url": receiver.url})


@pytest.fixture
async def adapter(harness: SmsHarness, provider_settings: Settings,
                  emulator: Emulator) -> AsyncIterator[ProviderClient]:
    client = await harness.open(provider_settings, 5.0)
    yield client
    await client.aclose()


def message(recipient: str, body: str = "Your code is 123456", *, attempt: int = 1,
            message_id: str | None = None) -> OutboundMessage:
    return OutboundMessage(message_id=message_id or uuid.uuid4().hex, attempt=attempt,
                           tenant_id="acme", channel=Channel.SMS, tier=Tier.P0,
                           recipient=recipient, body=body)


def assert_result(result: SendResult, outcome: Outcome, reason: str | None) -> None:
    assert (result.outcome, result.reason) == (outcome, reason), result
    assert result.started_at <= result.completed_at


# the contract -------------------------------------------------------------------------------


async def test_accepted(harness: SmsHarness, adapter: ProviderClient,
                        emulator: Emulator) -> None:
    msg = message(harness.recipients["ok"], attempt=2)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    assert result.provider_message_id is not None
    assert harness.provider_message_id.fullmatch(result.provider_message_id)
    assert result.provider_id == adapter.provider_id
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] == "accepted"
    assert record["sid"] == result.provider_message_id
    assert (record["attempt"], record["to"], record["body"]) == (2, msg.recipient, msg.body)


@pytest.mark.parametrize(("scenario", "reason", "deactivate"), [
    ("invalid", "invalid_recipient", False),
    ("unsubscribed", "unsubscribed", True),
    ("unreachable", "unreachable_recipient", False),
    ("not_mobile", "not_mobile", False),
    ("region", "region_not_permitted", False),
])
async def test_recipient_rejected_permanently(harness: SmsHarness, adapter: ProviderClient,
                                              emulator: Emulator, scenario: str, reason: str,
                                              deactivate: bool) -> None:
    msg = message(harness.recipients[scenario])
    result = await adapter.send(msg)
    assert_result(result, Outcome.PERMANENT, reason)
    assert result.deactivate_recipient is deactivate
    assert result.provider_message_id is None
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] != "accepted"


async def test_empty_body_is_permanent(harness: SmsHarness, adapter: ProviderClient,
                                       emulator: Emulator) -> None:
    result = await adapter.send(message(harness.recipients["ok"], body=""))
    assert_result(result, Outcome.PERMANENT, "invalid_content")


async def test_wrong_credentials(harness: SmsHarness, provider_settings: Settings,
                                 emulator: Emulator) -> None:
    raw = await harness.unauthorized(provider_settings)
    assert raw.status_code == 401
    assert raw.json() == dict(harness.unauthorized_body)
    client = await harness.open(harness.configure(provider_settings, {"secret": "x" * 32}), 5.0)
    try:
        msg = message(harness.recipients["ok"])
        result = await client.send(msg)
    finally:
        await client.aclose()
    assert_result(result, *harness.auth_rule)
    assert result.deactivate_recipient is False
    [record] = await emulator.records(msg.message_id)
    assert record["outcome"] == "unauthorized"


async def test_rate_limited_honours_retry_after(harness: SmsHarness, adapter: ProviderClient,
                                                emulator: Emulator) -> None:
    await emulator.configure(error_rate_429=1.0, retry_after_s=7)
    result = await adapter.send(message(harness.recipients["ok"]))
    assert_result(result, Outcome.TRANSIENT, "rate_limited")
    assert result.retry_after_s == 7.0


@pytest.mark.parametrize(("status", "outcome"), [(503, Outcome.TRANSIENT),
                                                 (500, Outcome.AMBIGUOUS)])
async def test_server_errors(harness: SmsHarness, adapter: ProviderClient, emulator: Emulator,
                             status: int, outcome: Outcome) -> None:
    await emulator.configure(error_rate_5xx=1.0, statuses_5xx=[status])
    for _ in range(3):
        result = await adapter.send(message(harness.recipients["ok"]))
        assert_result(result, outcome, "server_error")
        assert result.provider_message_id is None
    assert (await emulator.stats())["accepted"] == 0


async def test_outage_is_transient(harness: SmsHarness, adapter: ProviderClient,
                                   emulator: Emulator) -> None:
    await emulator.configure(outage=True)
    result = await adapter.send(message(harness.recipients["ok"]))
    assert_result(result, Outcome.TRANSIENT, "server_error")
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"]) == (1, 0)


async def test_accepted_then_timeout_is_ambiguous(harness: SmsHarness,
                                                  provider_settings: Settings,
                                                  emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=3.0)
    msg = message(harness.recipients["ok"])
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


async def test_connection_refused_is_transient(harness: SmsHarness, provider_settings: Settings,
                                               emulator: Emulator) -> None:
    dead = harness.configure(provider_settings, {"base_url": f"http://127.0.0.1:{free_port()}"})
    client = await harness.open(dead, 2.0)
    try:
        result = await client.send(message(harness.recipients["ok"]))
    finally:
        await client.aclose()
    assert_result(result, Outcome.TRANSIENT, "connect_error")
    assert (await emulator.stats())["received"] == 0


async def test_latency_knob(harness: SmsHarness, adapter: ProviderClient,
                            emulator: Emulator) -> None:
    await emulator.configure(latency_ms=200, latency_jitter_ms=0)
    result = await adapter.send(message(harness.recipients["ok"]))
    assert_result(result, Outcome.ACCEPTED, None)
    assert (result.completed_at - result.started_at).total_seconds() >= 0.19


async def test_duplicates_are_counted(harness: SmsHarness, adapter: ProviderClient,
                                      emulator: Emulator) -> None:
    msg = message(harness.recipients["ok"])
    for _ in range(2):
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    await adapter.send(message(harness.recipients["ok"]))
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["duplicates"]) == (3, 3, 1)
    assert stats["by_message_id"] == {"distinct": 2, "accepted_histogram": {"1": 1, "2": 1}}


async def test_retention_is_bounded(harness: SmsHarness, adapter: ProviderClient,
                                    emulator: Emulator) -> None:
    await emulator.configure(max_records=2)
    first, second = message(harness.recipients["ok"]), message(harness.recipients["ok"])
    for msg in (first, second, second):
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    stats = await emulator.stats()
    assert (stats["received"], stats["accepted"], stats["retained"]) == (3, 3, 2)
    assert stats["duplicates"] == 1
    assert stats["by_message_id"] == {"distinct": 1, "accepted_histogram": {"2": 1}}
    assert await emulator.records(first.message_id) == []


async def test_status_callbacks_are_signed(harness: SmsHarness, adapter: ProviderClient,
                                           emulator: Emulator, receiver: Receiver,
                                           provider_settings: Settings) -> None:
    await emulator.configure(callback_delay_ms=10)
    msg = message(harness.recipients["ok"], attempt=3)
    result = await adapter.send(msg)
    assert_result(result, Outcome.ACCEPTED, None)
    calls = await receiver.wait(msg.message_id, 2)
    secret = harness.secret(provider_settings)
    for call in calls:
        assert f"attempt={msg.attempt}" in call.url
        assert call.params[harness.callback_message_id] == result.provider_message_id
        assert harness.verify_callback(secret, call.url, call.params, call.headers)
        tampered = {**call.params, harness.callback_status: "read"}
        assert not harness.verify_callback(secret, call.url, tampered, call.headers)
        assert not harness.verify_callback("wrong", call.url, call.params, call.headers)
    assert {c.params[harness.callback_status] for c in calls} == {"sent",
                                                                    harness.final_statuses[0]}


async def test_undelivered_callback_carries_error(harness: SmsHarness, adapter: ProviderClient,
                                                  emulator: Emulator,
                                                  receiver: Receiver) -> None:
    await emulator.configure(callback_delay_ms=10, undelivered_rate=1.0)
    msg = message(harness.recipients["ok"])
    assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
    calls = await receiver.wait(msg.message_id, 2)
    final = [c for c in calls if c.params[harness.callback_status] != "sent"]
    assert [c.params[harness.callback_status] for c in final] == [harness.final_statuses[1]]
    assert final[0].params[harness.callback_error_field]


async def test_callback_failures_never_break_the_emulator(harness: SmsHarness,
                                                          provider_settings: Settings,
                                                          emulator: Emulator) -> None:
    await emulator.configure(callback_delay_ms=0)
    dead = harness.configure(provider_settings,
                             {"callback_url": f"http://127.0.0.1:{free_port()}/gone"})
    client = await harness.open(dead, 5.0)
    try:
        for _ in range(3):
            assert_result(await client.send(message(harness.recipients["ok"])),
                          Outcome.ACCEPTED, None)

        async def failed() -> int:
            while (n := (await emulator.stats())["callbacks"]["failed"]) < 6:
                await asyncio.sleep(0.05)
            return int(n)

        assert await asyncio.wait_for(failed(), 10) == 6
        assert_result(await client.send(message(harness.recipients["ok"])),
                      Outcome.ACCEPTED, None)
    finally:
        await client.aclose()
    health = await emulator.http.get(f"{emulator.base}/_admin/health")
    assert health.status_code == 200


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


def test_twilio_signature_matches_documented_example() -> None:
    url = "https://mycompany.com/myapp.php?foo=1&bar=2"
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234",
              "From": "+12349013030", "To": "+18005551212"}
    assert signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    assert twilio_documented_signature("12345", url, params) == "0/KCTR6DLpKmkAf8muzZqo1nDgQ="


async def test_twilio_per_call_timeout_override(fakes: str, settings: Settings,
                                                receiver: Receiver) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        emulator = Emulator(fakes, TWILIO.admin, http)
        await emulator.reset()
        await emulator.configure(timeout_rate=1.0, hang_s=3.0)
        client = await TwilioSms.open(TWILIO.configure(settings, {"callback_url": receiver.url}),
                                      timeout=10.0)
        try:
            result = await client.send(message(TWILIO.recipients["ok"]), timeout=0.3)
        finally:
            await client.aclose()
            await emulator.reset()
    assert_result(result, Outcome.AMBIGUOUS, "timeout")
    assert (result.completed_at - result.started_at).total_seconds() < 2.0
