"""Firebase Cloud Messaging (push): its harness, and FCM's OAuth2 access tokens (the emulator's
token endpoint, caching, one shared exchange on a cold start, refresh on 401) and its
platform and priority rules."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from notiflow.adapters.providers.base import Outcome
from notiflow.providers.fcm.client import FcmPush
from notiflow.providers.fcm.tokens import AccessTokens, ServiceAccount
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
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
    raw_post,
    send_and_close,
)

# the harness ----------------------------------------------------------------------------------


def _rsa_pem() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


async def _fcm_unauthorized(settings: Settings) -> httpx.Response:
    f = settings.fcm
    return await raw_post(f"{f.base_url}/v1/projects/{f.project_id}/messages:send",
                          headers={"Authorization": "Bearer ya29.not-a-token"},
                          json={"message": {"token": "d" * 64, "notification": {"body": "hi"}}})


FCM = Harness(
    name="fcm",
    channel=Channel.PUSH,
    recipients={"ok": device(), "unregistered": device("unregistered"),
                "invalid": device("invalid"), "mismatch": device("mismatch")},
    rejections=(Rejection("unregistered", "unregistered", deactivate=True),
                Rejection("invalid", "rejected"),
                Rejection("mismatch", "sender_id_mismatch")),
    configure=configure_section("fcm", {"base_url": "base_url", "secret": "private_key"}),
    adapter=FcmPush,
    unauthorized=_fcm_unauthorized,
    unauthorized_body={"error": {
        "code": 401, "status": "UNAUTHENTICATED",
        "message": "Request had invalid authentication credentials. Expected OAuth 2 access "
                   "token, login cookie or other valid authentication credential. See "
                   "https://developers.google.com/identity/sign-in/web/devconsole-project."}},
    wrong_secret=_rsa_pem,
    unauthorized_records=(),
    provider_message_id=re.compile(r"projects/[a-z0-9-]+/messages/0:\d+%[0-9a-f]{16}"),
)

pytestmark = [pytest.mark.integration, for_harness(FCM)]


# FCM's own cases ------------------------------------------------------------------------------

SHORT_LIVED = ("Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
               "timeframe. Check your iat and exp values in the JWT claim.")


async def _exchange(settings: Settings, assertion: str) -> httpx.Response:
    return await raw_post(settings.fcm.token_uri, data={
        "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer", "assertion": assertion})


def _rs256(claims: dict[str, Any], key: rsa.RSAPrivateKey) -> str:
    return jwt.encode(claims, key, algorithm="RS256")


def _claims(settings: Settings, **changes: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": settings.fcm.client_email,
            "scope": "https://www.googleapis.com/auth/firebase.messaging",
            "aud": settings.fcm.token_uri, "iat": now, "exp": now + 3600, **changes}


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


async def test_fcm_access_token_is_cached(harness: Harness, adapter: TimedClient,
                                          emulator: Emulator) -> None:
    for _ in range(3):
        assert_result(await adapter.send(message(harness)), Outcome.ACCEPTED, None)
    assert (await emulator.stats())["token"]["requests"] == 1
    assert isinstance(adapter, FcmPush) and adapter.tokens.exchanges == 1


async def test_fcm_cold_start_shares_one_exchange(harness: Harness, adapter: TimedClient,
                                                  emulator: Emulator) -> None:
    results = await asyncio.gather(*(adapter.send(message(harness)) for _ in range(20)))
    assert {r.outcome for r in results} == {Outcome.ACCEPTED}
    assert (await emulator.stats())["token"]["requests"] == 1


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


async def test_fcm_persistent_401_is_auth_failed(harness: Harness, provider_settings: Settings,
                                                 emulator: Emulator) -> None:
    async def bogus(_assertion: str, _timeout: float) -> tuple[str, float]:
        return "ya29.revoked", 3600.0

    account = ServiceAccount.from_settings(provider_settings.fcm)
    tokens = AccessTokens(account, bogus)
    client = await FcmPush.open(provider_settings, timeout=5.0)
    client.tokens = tokens
    msg = message(harness)
    result = await send_and_close(client, msg)
    assert_result(result, Outcome.TRANSIENT, "auth_failed")
    assert result.error_code == "UNAUTHENTICATED"
    assert tokens.exchanges == 2
    assert [r["outcome"] for r in await emulator.records(msg.message_id)] == [
        "unauthorized", "unauthorized"]


async def test_fcm_third_party_auth_error_is_not_a_token_problem(harness: Harness,
                                                                 adapter: TimedClient,
                                                                 emulator: Emulator) -> None:
    msg = message(harness, recipient=device("thirdpartyauth", PushPlatform.WEB))
    result = await adapter.send(msg)
    assert_result(result, Outcome.TRANSIENT, "misconfigured")
    assert result.error_code == "THIRD_PARTY_AUTH_ERROR"
    assert len(await emulator.records(msg.message_id)) == 1
    assert (await emulator.stats())["token"]["requests"] == 1


async def test_fcm_ios_waits_for_apns(harness: Harness, adapter: TimedClient,
                                      emulator: Emulator) -> None:
    ios = PushRecipient(device_token="ab" * 32, platform=PushPlatform.IOS)
    result = await adapter.send(message(harness, recipient=ios))
    assert_result(result, Outcome.TRANSIENT, "no_provider_for_platform")
    stats = await emulator.stats()
    assert (stats["received"], stats["token"]["requests"]) == (0, 0)


async def test_fcm_token_endpoint_outage_is_transient(harness: Harness, adapter: TimedClient,
                                                      emulator: Emulator) -> None:
    await emulator.configure(token_outage=True)
    result = await adapter.send(message(harness))
    assert_result(result, Outcome.TRANSIENT, "auth_unavailable")
    assert (await emulator.stats())["received"] == 0


async def test_fcm_priority_follows_the_tier(harness: Harness, adapter: TimedClient,
                                             emulator: Emulator) -> None:
    cases = [(Tier.P0, device(), "HIGH"), (Tier.P3, device(), "NORMAL"),
             (Tier.P1, device(platform=PushPlatform.WEB), "high")]
    for tier, recipient, priority in cases:
        msg = message(harness, tier=tier, recipient=recipient)
        assert_result(await adapter.send(msg), Outcome.ACCEPTED, None)
        [record] = await emulator.records(msg.message_id)
        assert (record["priority"], record["title"]) == (priority, msg.subject)
