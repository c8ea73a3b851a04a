"""The FCM classification tables row by row, the service-account JWT, the access-token cache
(injected clock, fake exchange) and the request body (pure; no network)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from pydantic import SecretStr

from notiflow.adapters.providers.base import DevEndpoints, Outcome
from notiflow.adapters.providers.common import Rule
from notiflow.providers.fcm.classify import (
    ERROR_CODES,
    HTTP_STATUSES,
    STATUS_CLASSES,
    classify_response,
    error_of,
)
from notiflow.providers.fcm.client import FcmPush
from notiflow.providers.fcm.config import FcmSettings
from notiflow.providers.fcm.dev import environment as dev_environment
from notiflow.providers.fcm.tokens import (
    SCOPE,
    AccessTokens,
    ServiceAccount,
    TokenError,
    assertion_claims,
    service_account_assertion,
)
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
from tests.helpers import loop_turns
from tests.unit import classification_cases as cases
from tests.unit.classification_cases import A, P, T

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = cases.pkcs8_pem(KEY)
TOKEN_URI = "https://oauth2.example.test/token"

EXPECTED_CODES: dict[str, tuple[Outcome, str, bool]] = {
    "UNREGISTERED": (P, "unregistered", True),
    "INVALID_ARGUMENT": (P, "rejected", False),
    "SENDER_ID_MISMATCH": (P, "sender_id_mismatch", False),
    "QUOTA_EXCEEDED": (T, "rate_limited", False),
    "UNAVAILABLE": (T, "server_error", False),
    "INTERNAL": (A, "server_error", False),
    "THIRD_PARTY_AUTH_ERROR": (T, "misconfigured", False),
}
CODE_STATUS = {"UNREGISTERED": 404, "INVALID_ARGUMENT": 400, "SENDER_ID_MISMATCH": 403,
               "QUOTA_EXCEEDED": 429, "UNAVAILABLE": 503, "INTERNAL": 500,
               "THIRD_PARTY_AUTH_ERROR": 401}


def test_tables_have_exactly_the_reviewed_rows() -> None:
    assert set(ERROR_CODES) == set(EXPECTED_CODES)
    cases.assert_http_tables(HTTP_STATUSES, STATUS_CLASSES)


@pytest.mark.parametrize(("code", "expected"), sorted(EXPECTED_CODES.items()))
def test_error_code_row(code: str, expected: tuple[Outcome, str, bool]) -> None:
    assert classify_response(CODE_STATUS[code], code) == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"), sorted(cases.HTTP_DEFAULT_STATUSES.items()))
def test_http_status_row_without_code(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status, None) == Rule(*expected)
    assert classify_response(status, "UNSPECIFIED_ERROR") == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"),
                         cases.status_class_cases(102, 204, 302, 409, 507, 600))
def test_status_class_fallback(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status, None) == Rule(*expected)


def test_error_code_wins_over_http_status() -> None:
    assert classify_response(401, "THIRD_PARTY_AUTH_ERROR") == Rule(T, "misconfigured")
    assert classify_response(404, "UNREGISTERED").deactivate is True
    assert classify_response(404, None) == Rule(T, "misconfigured")


def test_only_unregistered_deactivates_the_recipient() -> None:
    assert [c for c, r in ERROR_CODES.items() if r.deactivate] == ["UNREGISTERED"]


@pytest.mark.parametrize(("payload", "expected"), [
    ({"error": {"code": 404, "status": "NOT_FOUND", "message": "x", "details": [
        {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
         "errorCode": "UNREGISTERED"}]}}, ("NOT_FOUND", "UNREGISTERED")),
    ({"error": {"code": 400, "status": "INVALID_ARGUMENT", "details": [
        {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": []},
        {"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
         "errorCode": "INVALID_ARGUMENT"}]}}, ("INVALID_ARGUMENT", "INVALID_ARGUMENT")),
    ({"error": {"code": 401, "status": "UNAUTHENTICATED"}}, ("UNAUTHENTICATED", None)),
    ({"error": {"details": [{"@type": "other", "errorCode": "UNREGISTERED"}]}}, (None, None)),
    ({"error": "invalid_grant"}, (None, None)),
    (None, (None, None)),
])
def test_error_of(payload: object, expected: tuple[str | None, str | None]) -> None:
    assert error_of(payload) == expected


# the service-account JWT --------------------------------------------------------------------


def _account(**kw: Any) -> ServiceAccount:
    fields: dict[str, Any] = {"client_email": "sender@proj.iam.gserviceaccount.com",
                                 "private_key": KEY, "token_uri": TOKEN_URI,
                                 "private_key_id": "kid-1"}
    fields.update(kw)
    return ServiceAccount(**fields)


def pyjwt_verify(token: str, key: rsa.RSAPublicKey) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, claims) of an RS256 JWT whose signature PyJWT verifies with ``key``; claims
    unchecked."""
    decoded = jwt.decode_complete(token, key, algorithms=["RS256"], options={
        "verify_exp": False, "verify_iat": False, "verify_nbf": False, "verify_aud": False,
        "verify_iss": False})
    return decoded["header"], decoded["payload"]


def _segment(text: str) -> dict[str, object]:
    decoded = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    assert isinstance(decoded, dict)
    return decoded


def test_assertion_is_an_rs256_jwt_with_the_documented_claims() -> None:
    token = service_account_assertion(_account(), NOW)
    head, body, sig = token.split(".")
    assert _segment(head) == {"alg": "RS256", "typ": "JWT", "kid": "kid-1"}
    iat = int(NOW.timestamp())
    assert _segment(body) == {"iss": "sender@proj.iam.gserviceaccount.com",
                              "scope": "https://www.googleapis.com/auth/firebase.messaging",
                              "aud": TOKEN_URI, "iat": iat, "exp": iat + 3600}
    KEY.public_key().verify(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)),
                            f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    assert pyjwt_verify(token, KEY.public_key())[1]["aud"] == TOKEN_URI


def test_assertion_lifetime_is_capped_at_one_hour() -> None:
    claims = assertion_claims(_account(), NOW, lifetime=timedelta(hours=3))
    assert claims["exp"] - claims["iat"] == 3600
    short = assertion_claims(_account(), NOW, lifetime=timedelta(minutes=10))
    assert short["exp"] - short["iat"] == 600
    assert short["scope"] == SCOPE


def test_verify_jwt_rejects_forgeries() -> None:
    token = service_account_assertion(_account(), NOW)
    head, body, sig = token.split(".")
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(jwt.InvalidSignatureError):
        pyjwt_verify(token, other.public_key())
    tampered = jwt.encode({"iss": "x"}, KEY, algorithm="RS256").split(".")[1]
    with pytest.raises(jwt.InvalidSignatureError):
        pyjwt_verify(f"{head}.{tampered}.{sig}", KEY.public_key())
    none_alg = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    with pytest.raises(jwt.InvalidAlgorithmError):
        pyjwt_verify(f"{none_alg}.{body}.{sig}", KEY.public_key())
    for junk in ("a.b", "not-a-jwt", "!!.??.**"):
        with pytest.raises(jwt.InvalidTokenError):
            pyjwt_verify(junk, KEY.public_key())


def test_service_account_from_settings() -> None:
    config = FcmSettings(client_email="a@b.iam.gserviceaccount.com", private_key=SecretStr(PEM),
                         token_uri=TOKEN_URI)
    account = ServiceAccount.from_settings(config)
    assert (account.client_email, account.token_uri) == ("a@b.iam.gserviceaccount.com",
                                                         TOKEN_URI)
    with pytest.raises(ValueError, match="not configured"):
        ServiceAccount.from_settings(FcmSettings())
    ec_pem = cases.pkcs8_pem(ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(ValueError, match="RSA"):
        ServiceAccount.from_settings(config.model_copy(update={"private_key": SecretStr(ec_pem)}))


# the access-token cache ---------------------------------------------------------------------


class FakeExchange:
    """Issues ``tok-N`` tokens; optionally blocks until released or fails."""

    def __init__(self, expires_in: float = 3600.0) -> None:
        self.expires_in = expires_in
        self.assertions: list[str] = []
        self.gate: asyncio.Event | None = None
        self.error: Exception | None = None

    async def __call__(self, assertion: str, timeout: float) -> tuple[str, float]:
        self.assertions.append(assertion)
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        return f"tok-{len(self.assertions)}", self.expires_in


def _tokens(exchange: FakeExchange, clock: list[datetime]) -> AccessTokens:
    return AccessTokens(_account(), exchange, clock=lambda: clock[0])


async def test_token_is_cached_until_shortly_before_expiry() -> None:
    clock, exchange = [NOW], FakeExchange(3600.0)
    tokens = _tokens(exchange, clock)
    assert await tokens.get(1.0) == "tok-1"
    clock[0] = NOW + timedelta(minutes=54, seconds=59)
    assert await tokens.get(1.0) == "tok-1"
    clock[0] = NOW + timedelta(minutes=55)
    assert await tokens.get(1.0) == "tok-2"
    assert tokens.exchanges == 2
    second_iat = _segment(exchange.assertions[1].split(".")[1])["iat"]
    assert second_iat == int((NOW + timedelta(minutes=55)).timestamp())


async def test_short_lived_token_refreshes_a_tenth_before_expiry() -> None:
    clock, exchange = [NOW], FakeExchange(60.0)
    tokens = _tokens(exchange, clock)
    await tokens.get(1.0)
    cached = tokens.cached
    assert cached is not None and cached.refresh_at == NOW + timedelta(seconds=54)


async def test_concurrent_callers_share_one_exchange() -> None:
    clock, exchange = [NOW], FakeExchange()
    exchange.gate = asyncio.Event()
    tokens = _tokens(exchange, clock)
    waiters = [asyncio.ensure_future(tokens.get(5.0)) for _ in range(10)]
    await loop_turns()
    exchange.gate.set()
    assert set(await asyncio.gather(*waiters)) == {"tok-1"}
    assert tokens.exchanges == 1


async def test_failed_exchange_reaches_every_waiter_and_is_not_cached() -> None:
    clock, exchange = [NOW], FakeExchange()
    exchange.gate = asyncio.Event()
    exchange.error = TokenError(Rule(T, "auth_failed"), "invalid_grant")
    tokens = _tokens(exchange, clock)
    waiters = [asyncio.ensure_future(tokens.get(5.0)) for _ in range(3)]
    await loop_turns()
    exchange.gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, TokenError) and r.error_code == "invalid_grant" for r in results)
    assert tokens.cached is None
    exchange.error, exchange.gate = None, None
    assert await tokens.get(1.0) == "tok-2"


async def test_a_waiter_timing_out_does_not_cancel_the_exchange() -> None:
    clock, exchange = [NOW], FakeExchange()
    exchange.gate = asyncio.Event()
    tokens = _tokens(exchange, clock)
    with pytest.raises(TimeoutError):
        await tokens.get(0.01)
    exchange.gate.set()
    assert await tokens.get(1.0) == "tok-1"
    assert tokens.exchanges == 1


async def test_invalidate_drops_only_the_refused_token() -> None:
    clock, exchange = [NOW], FakeExchange()
    tokens = _tokens(exchange, clock)
    first = await tokens.get(1.0)
    tokens.invalidate("some-older-token")
    assert await tokens.get(1.0) == first
    tokens.invalidate(first)
    second = await tokens.get(1.0)
    tokens.invalidate(first)
    assert second == "tok-2" and await tokens.get(1.0) == second
    assert tokens.exchanges == 2


# the request body and local decisions -------------------------------------------------------


def _config() -> FcmSettings:
    return FcmSettings(project_id="proj", base_url="http://127.0.0.1:9",
                       client_email="a@proj.iam.gserviceaccount.com", private_key=SecretStr(PEM))


_message = partial(cases.outbound, channel=Channel.PUSH, attempt=3, tier=Tier.P0,
                   body="Body", subject="Title")


ANDROID = PushRecipient(device_token="a" * 40, platform=PushPlatform.ANDROID)
WEB = PushRecipient(device_token="w" * 40, platform=PushPlatform.WEB)
IOS = PushRecipient(device_token="ab" * 32, platform=PushPlatform.IOS)


async def _client(session: aiohttp.ClientSession, exchange: FakeExchange,
                  clock: Callable[[], datetime] = lambda: NOW) -> FcmPush:
    tokens = AccessTokens(_account(), exchange, clock=clock)
    return FcmPush(_config(), session, timeout=1.0, clock=clock, tokens=tokens)


@pytest.mark.parametrize(("tier", "priority"), [(Tier.P0, "HIGH"), (Tier.P1, "HIGH"),
                                                (Tier.P2, "NORMAL"), (Tier.P3, "NORMAL")])
async def test_android_body_priority_by_tier(tier: Tier, priority: str) -> None:
    async with aiohttp.ClientSession() as session:
        client = await _client(session, FakeExchange())
        assert client.payload(_message(recipient=ANDROID, tier=tier)) == {"message": {
            "token": "a" * 40,
            "notification": {"body": "Body", "title": "Title"},
            "data": {"message_id": "msg_1", "attempt": "3"},
            "android": {"priority": priority},
        }}


async def test_web_body_uses_webpush_urgency_and_optional_title() -> None:
    async with aiohttp.ClientSession() as session:
        client = await _client(session, FakeExchange())
        body = client.payload(_message(recipient=WEB, tier=Tier.P3, subject=None))["message"]
    assert body["webpush"] == {"headers": {"Urgency": "normal"}}
    assert "android" not in body and body["notification"] == {"body": "Body"}


async def test_ios_waits_for_apns_without_any_request() -> None:
    exchange = FakeExchange()
    async with aiohttp.ClientSession() as session:
        client = await _client(session, exchange)
        result = await client.send(_message(recipient=IOS))
    assert (result.outcome, result.reason, result.error_code) == (
        T, "no_provider_for_platform", "ios")
    assert exchange.assertions == []


async def test_text_recipient_is_permanent() -> None:
    async with aiohttp.ClientSession() as session:
        client = await _client(session, FakeExchange())
        result = await client.send(_message(recipient="ada@example.com"))
    assert (result.outcome, result.reason) == (P, "invalid_recipient")


async def test_token_failures_are_transient_and_never_ambiguous() -> None:
    exchange = FakeExchange()
    exchange.error = TokenError(Rule(T, "auth_unavailable"), "http_503", retry_after_s=4.0)
    async with aiohttp.ClientSession() as session:
        client = await _client(session, exchange)
        result = await client.send(_message(recipient=ANDROID))
        assert (result.outcome, result.reason, result.error_code, result.retry_after_s) == (
            T, "auth_unavailable", "http_503", 4.0)
        exchange.error = None
        exchange.gate = asyncio.Event()
        slow = await client.send(_message(recipient=ANDROID), timeout=0.05)
        exchange.gate.set()
    assert (slow.outcome, slow.reason, slow.error_code) == (T, "auth_unavailable",
                                                            "TimeoutError")


async def test_open_requires_a_service_account() -> None:
    with pytest.raises(ValueError, match="not configured"):
        await FcmPush.open(FcmSettings(), timeout=1.0)


def test_push_is_enabled_by_the_service_account() -> None:
    assert Channel.PUSH not in Settings().enabled_channels()
    assert Channel.PUSH not in Settings(
        fcm=FcmSettings(client_email="a@b.c")).enabled_channels()
    on = Settings(fcm=_config())
    assert Channel.PUSH in on.enabled_channels()
    assert on.provider_rates["fcm"] > 0


def test_dev_credentials_are_a_usable_service_account(tmp_path: Path) -> None:
    env = dev_environment(DevEndpoints.loopback(fakes_port=2, webhook_port=1, apns_port=3,
                                                tls_dir=tmp_path))
    config = FcmSettings(
        base_url=env["NOTIFLOW_FCM__BASE_URL"], token_uri=env["NOTIFLOW_FCM__TOKEN_URI"],
        project_id=env["NOTIFLOW_FCM__PROJECT_ID"],
        client_email=env["NOTIFLOW_FCM__CLIENT_EMAIL"],
        private_key=SecretStr(env["NOTIFLOW_FCM__PRIVATE_KEY"]),
        private_key_id=env["NOTIFLOW_FCM__PRIVATE_KEY_ID"])
    account = ServiceAccount.from_settings(config)
    assert account.token_uri == "http://127.0.0.1:2/fcm/token"
    assert config.base_url == "http://127.0.0.1:2/fcm"
    assert account.client_email.endswith(f"@{config.project_id}.iam.gserviceaccount.com")
    assert pyjwt_verify(service_account_assertion(account, NOW),
                      account.private_key.public_key())[0]["kid"] == config.private_key_id
