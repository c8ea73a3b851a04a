"""Apple Push Notification service (push, HTTP/2): its harness, the wire format, provider tokens
(the emulator's checks, one early refresh, no retry of an invalid key), and the one
multiplexed connection (500 concurrent streams, a lost connection after a send)."""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from notiflow.adapters.providers.base import Outcome
from notiflow.providers.apns.client import ApnsPush
from notiflow.providers.apns.tokens import provider_token
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
from tests.helpers import wait_until
from tests.integration.contract.harness import (
    Emulator,
    Harness,
    Rejection,
    TimedClient,
    assert_result,
    configure_section,
    device,
    for_harness,
    message,
    send_and_close,
    send_once,
)

# the harness ----------------------------------------------------------------------------------


def _ec_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def apns_http(settings: Settings) -> httpx.AsyncClient:
    """An independent HTTP/2 client trusting the emulator's test CA (raw requests)."""
    context = ssl.create_default_context(cafile=settings.apns.ca_file)
    return httpx.AsyncClient(http2=True, http1=False, verify=context, timeout=10)


def signed_token(settings: Settings, at: datetime, pem: str | None = None) -> str:
    """A provider token of the session's team and key id issued at ``at``, signed with ``pem``
    (default: the session's key)."""
    a = settings.apns
    assert a.team_id and a.key_id
    if pem is None:
        assert a.private_key is not None
        pem = a.private_key.get_secret_value()
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return provider_token(a.team_id, a.key_id, key, at)


async def push_raw(client: httpx.AsyncClient, settings: Settings, token: str | None,
                   device_token: str = "ab" * 32) -> httpx.Response:
    """The emulator's HTTP/2 answer to a raw alert for ``device_token`` with provider token
    ``token`` (None: no authorization header)."""
    headers = {"apns-topic": settings.apns.topic, "apns-push-type": "alert"}
    if token is not None:
        headers["authorization"] = f"bearer {token}"
    response = await client.post(f"{settings.apns.base_url}/3/device/{device_token}",
                                 headers=headers, content=b'{"aps": {"alert": "hi"}}')
    assert response.http_version == "HTTP/2"
    return response


async def _apns_unauthorized(settings: Settings) -> httpx.Response:
    async with apns_http(settings) as client:
        return await push_raw(client, settings,
                              signed_token(settings, datetime.now(UTC), _ec_pem()))


def ios_device(prefix: str = "0123") -> PushRecipient:
    token = (prefix + uuid.uuid4().hex + uuid.uuid4().hex)[:64]
    return PushRecipient(device_token=token, platform=PushPlatform.IOS)


APNS = Harness(
    name="apns",
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
    adapter=ApnsPush,
    unauthorized=_apns_unauthorized,
    unauthorized_body={"reason": "InvalidProviderToken"},
    wrong_secret=_ec_pem,
    provider_message_id=re.compile(
        r"[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"),
    retry_after=False,
    unauthorized_status=403,
)

pytestmark = [pytest.mark.integration, for_harness(APNS)]


# APNs' own cases ------------------------------------------------------------------------------


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


async def test_apns_emulator_checks_the_provider_token(harness: Harness,
                                                       provider_settings: Settings,
                                                       emulator: Emulator) -> None:
    now = datetime.now(UTC)

    async def post(client: httpx.AsyncClient, token: str | None) -> httpx.Response:
        return await push_raw(client, provider_settings, token)

    def signed(age: timedelta) -> str:
        return signed_token(provider_settings, now - age)

    async with apns_http(provider_settings) as client:
        missing = await post(client, None)
        garbage = await post(client, "not.a.jwt")
        stale = await post(client, signed(timedelta(minutes=61)))
        good = await post(client, signed(timedelta(minutes=10)))
        newer = await post(client, signed(timedelta(0)))
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


async def test_apns_unregistered_carries_a_timestamp(harness: Harness,
                                                     provider_settings: Settings,
                                                     emulator: Emulator) -> None:
    token = signed_token(provider_settings, datetime.now(UTC))
    async with apns_http(provider_settings) as client:
        r = await push_raw(client, provider_settings, token, "0" * 64)
    assert r.status_code == 410 and r.json()["reason"] == "Unregistered"
    assert abs(r.json()["timestamp"] / 1000 - time.time()) < 60


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


async def test_apns_invalid_provider_token_is_not_retried(harness: Harness,
                                                          provider_settings: Settings,
                                                          emulator: Emulator) -> None:
    wrong = provider_settings.model_copy(update={
        "apns": provider_settings.apns.model_copy(update={"key_id": "WRONGKEY01"})})
    client = await ApnsPush.open(wrong, timeout=5.0)
    msg = message(harness)
    result = await send_and_close(client, msg)
    assert_result(result, Outcome.TRANSIENT, "auth_failed")
    assert (result.error_code, result.deactivate_recipient) == ("InvalidProviderToken", False)
    assert len(await emulator.records(msg.message_id)) == 1
    assert client.tokens.signed == 1


async def test_apns_only_takes_ios_tokens(harness: Harness, adapter: TimedClient,
                                          emulator: Emulator) -> None:
    result = await adapter.send(message(harness, recipient=device()))
    assert_result(result, Outcome.TRANSIENT, "no_provider_for_platform")
    assert (await emulator.stats())["received"] == 0


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


async def test_apns_untrusted_certificate_is_connect_error(harness: Harness,
                                                           provider_settings: Settings,
                                                           emulator: Emulator) -> None:
    untrusted = provider_settings.model_copy(update={
        "apns": provider_settings.apns.model_copy(update={"ca_file": None})})
    result = await send_once(harness, untrusted, message(harness))
    assert_result(result, Outcome.TRANSIENT, "connect_error")
    assert (await emulator.stats())["received"] == 0


async def test_apns_connection_lost_after_send_is_ambiguous(harness: Harness,
                                                            adapter: TimedClient,
                                                            emulator: Emulator) -> None:
    await emulator.configure(timeout_rate=1.0, hang_s=30.0)
    msg = message(harness)
    pending = asyncio.create_task(adapter.send(msg))
    await wait_until(lambda: emulator.records(msg.message_id), timeout=10, interval=0.02,
                     what="the request at the emulator")
    dropped = await emulator.http.post(f"{emulator.base}/_admin/apns/drop-connections")
    assert dropped.json()["dropped"] >= 1
    result = await asyncio.wait_for(pending, 5.0)
    assert_result(result, Outcome.AMBIGUOUS, "connection_lost")
    assert result.error_code == "ConnectError:sent"
    await emulator.configure(timeout_rate=0.0)
    assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    assert (await emulator.stats())["connections"]["opened"] == 2
