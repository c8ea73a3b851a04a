"""The APNs classification tables row by row, the ES256 provider token and its cache (injected
clock), the request headers and body, and the emulator's token and request checks (pure; no
network)."""

from __future__ import annotations

import base64
import itertools
import json
import ssl
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
from jwt.algorithms import ECAlgorithm
from jwt.utils import base64url_encode
from pydantic import SecretStr
from pyreqwest import exceptions as rq

from notiflow.adapters.providers.base import DevEndpoints, OutboundMessage, Outcome
from notiflow.adapters.providers.common import Rule
from notiflow.providers.apns.classify import (
    HTTP_STATUSES,
    REASONS,
    STATUS_CLASSES,
    classify_exception,
    classify_response,
    reason_of,
    transport_code,
)
from notiflow.providers.apns.client import APNS_ID_NAMESPACE, ApnsPush, apns_id
from notiflow.providers.apns.config import ApnsSettings
from notiflow.providers.apns.dev import environment as dev_environment
from notiflow.providers.apns.emulator import ApnsEmulator, Request, TokenState
from notiflow.providers.apns.tokens import ProviderTokens, provider_token
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
from tests.fakes import ManualClock
from tests.unit import classification_cases as cases
from tests.unit.classification_cases import A, P, T

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
KEY = ec.generate_private_key(ec.SECP256R1())
PEM = cases.pkcs8_pem(KEY)
TEAM, KID = "TEAM000001", "KEY0000001"
CONFIG = ApnsSettings(team_id=TEAM, key_id=KID, private_key=SecretStr(PEM))

EXPECTED_REASONS: dict[str, tuple[int, Outcome, str, bool]] = {
    "BadDeviceToken": (400, P, "invalid_recipient", True),
    "Unregistered": (410, P, "unregistered", True),
    "ExpiredToken": (410, P, "unregistered", True),
    "DeviceTokenNotForTopic": (400, P, "token_not_for_topic", False),
    "MissingDeviceToken": (400, P, "invalid_recipient", False),
    "PayloadEmpty": (400, P, "invalid_content", False),
    "PayloadTooLarge": (413, P, "invalid_content", False),
    "BadCollapseId": (400, P, "rejected", False),
    "BadExpirationDate": (400, P, "rejected", False),
    "BadTopic": (400, T, "misconfigured", False),
    "MissingTopic": (400, T, "misconfigured", False),
    "TopicDisallowed": (400, T, "misconfigured", False),
    "BadMessageId": (400, T, "misconfigured", False),
    "BadPriority": (400, T, "misconfigured", False),
    "DuplicateHeaders": (400, T, "misconfigured", False),
    "InvalidPushType": (400, T, "misconfigured", False),
    "BadPath": (404, T, "misconfigured", False),
    "MethodNotAllowed": (405, T, "misconfigured", False),
    "Forbidden": (403, T, "misconfigured", False),
    "UnrelatedKeyIdInToken": (403, T, "misconfigured", False),
    "ExpiredProviderToken": (403, T, "auth_failed", False),
    "InvalidProviderToken": (403, T, "auth_failed", False),
    "MissingProviderToken": (403, T, "auth_failed", False),
    "BadCertificate": (403, T, "auth_failed", False),
    "BadCertificateEnvironment": (403, T, "auth_failed", False),
    "TooManyProviderTokenUpdates": (429, T, "auth_failed", False),
    "TooManyRequests": (429, T, "rate_limited", False),
    "IdleTimeout": (400, T, "connection_lost", False),
    "InternalServerError": (500, A, "server_error", False),
    "ServiceUnavailable": (503, T, "server_error", False),
    "Shutdown": (503, T, "server_error", False),
}

EXPECTED_STATUSES: dict[int, tuple[Outcome, str, bool]] = {
    400: (P, "rejected", False),
    403: (T, "auth_failed", False),
    404: (T, "misconfigured", False),
    405: (T, "misconfigured", False),
    410: (P, "unregistered", True),
    413: (P, "invalid_content", False),
    429: (T, "rate_limited", False),
    500: (A, "server_error", False),
    502: (T, "server_error", False),
    503: (T, "server_error", False),
    504: (A, "gateway_timeout", False),
}


def test_tables_have_exactly_the_reviewed_rows() -> None:
    assert set(REASONS) == set(EXPECTED_REASONS)
    cases.assert_http_tables(HTTP_STATUSES, STATUS_CLASSES, EXPECTED_STATUSES)


@pytest.mark.parametrize(("reason", "expected"), sorted(EXPECTED_REASONS.items()))
def test_reason_row(reason: str, expected: tuple[int, Outcome, str, bool]) -> None:
    status, outcome, why, deactivate = expected
    assert classify_response(status, reason) == Rule(outcome, why, deactivate)


@pytest.mark.parametrize(("status", "expected"), sorted(EXPECTED_STATUSES.items()))
def test_http_status_row_without_reason(status: int,
                                        expected: tuple[Outcome, str, bool]) -> None:
    assert classify_response(status, None) == Rule(*expected)
    assert classify_response(status, "SomeFutureReason") == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"), cases.status_class_cases(
    101, 204, 302, 409, 507, 600, classes={**cases.STATUS_CLASSES, 2: (A, "unexpected_status")}))
def test_status_class_fallback(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_response(status, None) == Rule(*expected)


def test_only_dead_tokens_deactivate_the_recipient() -> None:
    assert {r for r, rule in REASONS.items() if rule.deactivate} == {
        "BadDeviceToken", "Unregistered", "ExpiredToken"}


def test_reason_wins_over_http_status() -> None:
    assert classify_response(429, "TooManyProviderTokenUpdates") == Rule(T, "auth_failed")
    assert classify_response(403, "Forbidden") == Rule(T, "misconfigured")
    assert classify_response(400, "IdleTimeout") == Rule(T, "connection_lost")


def _details(*causes: str) -> dict[str, Any]:
    return {"causes": [{"message": c} for c in causes] or None}


CONNECTING = ("error sending request for url (https://x/3/device/ab)", "client error (Connect)",
              "tcp connect error", "Connection refused (os error 111)")
SENT = ("error sending request for url (https://x/3/device/ab)", "client error (SendRequest)",
        "connection error", "peer closed connection without sending TLS close_notify")


@pytest.mark.parametrize(("exc", "expected"), [
    (rq.ConnectTimeoutError("connection timeout", _details(*CONNECTING)), (T, "connect_timeout")),
    (rq.ConnectError("connection error", _details(*CONNECTING)), (T, "connect_error")),
    (rq.ConnectTimeoutError("connection timeout", _details(*SENT)), (A, "timeout")),
    (rq.ConnectTimeoutError("connection timeout", _details()), (A, "timeout")),
    (rq.ConnectError("connection error", _details(*SENT)), (A, "connection_lost")),
    (rq.PoolTimeoutError("pool timeout", _details()), (T, "connect_timeout")),
    (rq.BuilderError("bad header", _details()), (T, "misconfigured")),
    (TimeoutError(), (A, "timeout")),
    (rq.ReadError("read error", _details(*CONNECTING)), (A, "connection_lost")),
    (rq.WriteError("write error", _details()), (A, "connection_lost")),
    (rq.ClientClosedError("closed", _details()), (A, "transport_error")),
    (RuntimeError("boom"), (A, "client_error")),
])
def test_transport_rows(exc: BaseException, expected: tuple[Outcome, str]) -> None:
    assert classify_exception(exc) == Rule(*expected)


def test_transport_code_marks_connect_errors_after_sending() -> None:
    assert transport_code(rq.ConnectError("e", _details(*CONNECTING))) == "ConnectError"
    assert transport_code(rq.ConnectError("e", _details(*SENT))) == "ConnectError:sent"
    assert transport_code(rq.ConnectTimeoutError("e", _details())) == "ConnectTimeoutError:sent"
    assert transport_code(TimeoutError()) == "TimeoutError"


@pytest.mark.parametrize(("raw", "expected"), [
    (b'{"reason": "BadDeviceToken"}', "BadDeviceToken"),
    (b'{"reason": "Unregistered", "timestamp": 1754402113000}', "Unregistered"),
    (b'{"reason": ""}', None),
    (b'{"reason": 7}', None),
    (b"[]", None),
    (b"not json", None),
    (b"", None),
])
def test_reason_of(raw: bytes, expected: str | None) -> None:
    assert reason_of(raw) == expected


# provider token -------------------------------------------------------------------------------


def _segments(token: str) -> tuple[dict[str, Any], dict[str, Any], bytes]:
    def decode(part: str) -> bytes:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))

    header, claims, signature = token.split(".")
    return json.loads(decode(header)), json.loads(decode(claims)), decode(signature)


def test_provider_token_is_es256_with_the_documented_header_and_claims() -> None:
    token = provider_token(TEAM, KID, KEY, NOW)
    header, claims, signature = _segments(token)
    assert header == {"alg": "ES256", "kid": KID}
    assert claims == {"iss": TEAM, "iat": int(NOW.timestamp())}
    assert len(signature) == 64
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"),
                               int.from_bytes(signature[32:], "big"))
    signing_input = token.rsplit(".", 1)[0].encode()
    KEY.public_key().verify(der, signing_input, ec.ECDSA(hashes.SHA256()))
    with pytest.raises(InvalidSignature):
        KEY.public_key().verify(der, signing_input + b"x", ec.ECDSA(hashes.SHA256()))


def pyjwt_verify(token: str, key: ec.EllipticCurvePublicKey
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, claims) of an ES256 JWT whose signature PyJWT verifies; claims unchecked."""
    decoded = jwt.decode_complete(token, key, algorithms=["ES256"], options={
        "verify_exp": False, "verify_iat": False, "verify_nbf": False, "verify_aud": False,
        "verify_iss": False})
    return decoded["header"], decoded["payload"]


def _es256_under_header(header: dict[str, Any], claims: dict[str, Any],
                        key: ec.EllipticCurvePrivateKey) -> str:
    """A JWS whose header is exactly ``header``, ES256-signed whatever its ``alg`` says."""
    signing_input = b".".join(base64url_encode(json.dumps(part).encode())
                              for part in (header, claims))
    signature = ECAlgorithm(ECAlgorithm.SHA256).sign(signing_input, key)
    return f"{signing_input.decode()}.{base64url_encode(signature).decode()}"


def test_verify_es256_round_trip_and_forgeries() -> None:
    at = datetime.fromtimestamp(1, UTC)
    token = provider_token(TEAM, KID, KEY, at)
    assert pyjwt_verify(token, KEY.public_key()) == ({"alg": "ES256", "kid": KID},
                                                     {"iss": TEAM, "iat": 1})
    other = ec.generate_private_key(ec.SECP256R1())
    forged = provider_token(TEAM, KID, other, at)
    header, claims, _ = token.split(".")
    later = provider_token(TEAM, KID, KEY, datetime.fromtimestamp(2, UTC))
    for bad in (forged, f"{header}.{claims}.", f"{header}.{claims}", "a.b.c", "",
                _es256_under_header({"alg": "HS256", "kid": KID}, {"iss": TEAM}, KEY),
                f"{header}.{later.split('.')[1]}.{token.split('.')[2]}"):
        with pytest.raises(jwt.InvalidTokenError):
            pyjwt_verify(bad, KEY.public_key())


def test_token_is_reused_until_refresh_after() -> None:
    clock = ManualClock(NOW)
    tokens = ProviderTokens(TEAM, KID, KEY, clock=clock)
    first = tokens.current()
    for minutes in (1, 20, 44):
        clock.now = NOW + timedelta(minutes=minutes, seconds=59)
        assert tokens.current() == first
    clock.now = NOW + timedelta(minutes=45)
    second = tokens.current()
    assert second != first and tokens.signed == 2
    assert _segments(second)[1]["iat"] == int(clock.now.timestamp())


def test_token_refresh_stays_within_apples_window() -> None:
    for bad in (timedelta(minutes=19, seconds=59), timedelta(minutes=60)):
        with pytest.raises(ValueError):
            ProviderTokens(TEAM, KID, KEY, refresh_after=bad)
    clock = ManualClock(NOW)
    tokens = ProviderTokens(TEAM, KID, KEY, clock=clock, refresh_after=timedelta(minutes=20))
    issued = []
    for second in range(0, 3 * 3600, 30):
        clock.now = NOW + timedelta(seconds=second)
        token = tokens.current()
        if not issued or issued[-1][1] != token:
            issued.append((clock.now, token))
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(issued)]
    assert gaps and all(timedelta(minutes=20) <= g < timedelta(hours=1) for g in gaps)


def test_expired_forces_one_early_refresh_per_20_minutes() -> None:
    clock = ManualClock(NOW)
    tokens = ProviderTokens(TEAM, KID, KEY, clock=clock)
    first = tokens.current()
    clock.now += timedelta(minutes=1)
    assert tokens.expired(first) is True
    second = tokens.current()
    assert second != first
    assert tokens.expired(first) is True, "a stale value: retry with the current token"
    assert tokens.current() == second
    clock.now += timedelta(minutes=5)
    assert tokens.expired(second) is False, "a second early refresh within 20 minutes"
    assert tokens.current() == second
    clock.now += timedelta(minutes=15)
    assert tokens.expired(second) is True
    assert tokens.current() not in (first, second)
    assert tokens.signed == 3


def test_tokens_from_settings() -> None:
    assert ProviderTokens.from_settings(CONFIG).key_id == KID
    rsa_pem = cases.pkcs8_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    p384 = cases.pkcs8_pem(ec.generate_private_key(ec.SECP384R1()))
    for config in (ApnsSettings(),
                   CONFIG.model_copy(update={"team_id": None}),
                   CONFIG.model_copy(update={"private_key": SecretStr(rsa_pem)}),
                   CONFIG.model_copy(update={"private_key": SecretStr(p384)}),
                   CONFIG.model_copy(update={"private_key": SecretStr("not a key")})):
        with pytest.raises(ValueError):
            ProviderTokens.from_settings(config)


# request ------------------------------------------------------------------------------------


def message(tier: Tier = Tier.P1, *, platform: PushPlatform = PushPlatform.IOS,
            message_id: str | None = None, attempt: int = 1, body: str = "Your code is 1",
            subject: str | None = "Code") -> OutboundMessage:
    token = "ab" * 32 if platform is PushPlatform.IOS else "f" * 64
    return OutboundMessage(message_id or uuid.uuid4().hex, attempt, "acme", Channel.PUSH, tier,
                           PushRecipient(device_token=token, platform=platform), body, subject)


def test_apns_id_is_a_stable_uuid5_of_message_and_attempt() -> None:
    one = message(message_id="m-1", attempt=1)
    assert apns_id(one) == apns_id(message(message_id="m-1", attempt=1))
    assert apns_id(one) != apns_id(message(message_id="m-1", attempt=2))
    assert uuid.UUID(apns_id(one)) == uuid.uuid5(APNS_ID_NAMESPACE, "m-1:1")
    assert uuid.UUID(apns_id(one)).version == 5


@pytest.mark.parametrize(("tier", "priority"), [(Tier.P0, "10"), (Tier.P1, "10"),
                                                (Tier.P2, "5"), (Tier.P3, "5")])
async def test_headers_by_tier(tier: Tier, priority: str) -> None:
    settings = Settings(apns=CONFIG, time_scale=0.5)
    client = await ApnsPush.open(settings, timeout=1.0)
    try:
        msg = message(tier)
        headers = client.headers(msg, NOW)
    finally:
        await client.aclose()
    expected_expiration = ("0" if tier is Tier.P0
                           else str(int((NOW + settings.tier_ttl(tier)).timestamp())))
    assert headers == {"apns-topic": CONFIG.topic, "apns-push-type": "alert",
                       "apns-priority": priority, "apns-expiration": expected_expiration,
                       "apns-id": apns_id(msg), "apns-collapse-id": msg.message_id,
                       "content-type": "application/json"}


async def test_long_message_id_gets_no_collapse_id_and_default_ttls() -> None:
    client = await ApnsPush.open(CONFIG, timeout=1.0)
    try:
        headers = client.headers(message(Tier.P1, message_id="m" * 65), NOW)
    finally:
        await client.aclose()
    assert "apns-collapse-id" not in headers
    assert headers["apns-expiration"] == str(int((NOW + timedelta(minutes=30)).timestamp()))


async def test_payload_shape() -> None:
    client = await ApnsPush.open(CONFIG, timeout=1.0)
    try:
        with_title = json.loads(client.payload(message(message_id="m-1", attempt=3)))
        without = json.loads(client.payload(message(subject=None, message_id="m-2")))
    finally:
        await client.aclose()
    assert with_title == {"aps": {"alert": {"title": "Code", "body": "Your code is 1"}},
                          "message_id": "m-1", "attempt": 3}
    assert without["aps"] == {"alert": {"body": "Your code is 1"}}


@pytest.mark.parametrize("platform", [PushPlatform.ANDROID, PushPlatform.WEB])
async def test_non_ios_recipient_gets_no_request(platform: PushPlatform) -> None:
    client = await ApnsPush.open(CONFIG.model_copy(update={"base_url": "https://127.0.0.1:9"}),
                                 timeout=1.0)
    try:
        result = await client.send(message(platform=platform))
        text = await client.send(OutboundMessage("m", 1, "acme", Channel.PUSH, Tier.P1,
                                                 "+14155550100", "hi"))
        too_big = await client.send(message(body="x" * 5000))
    finally:
        await client.aclose()
    assert (result.outcome, result.reason, result.error_code) == (
        T, "no_provider_for_platform", platform.value)
    assert (text.outcome, text.reason) == (P, "invalid_recipient")
    assert (too_big.outcome, too_big.reason, too_big.error_code) == (
        P, "invalid_content", "PayloadTooLarge")
    assert client.tokens.signed == 0


async def test_open_requires_the_key() -> None:
    with pytest.raises(ValueError):
        await ApnsPush.open(ApnsSettings(), timeout=1.0)
    with pytest.raises(ValueError):
        await ApnsPush.open(CONFIG, timeout=0)


def test_apns_is_enabled_by_team_key_id_and_key() -> None:
    assert "apns" in Settings(apns=CONFIG).enabled_providers()
    assert "apns" not in Settings(apns=CONFIG.model_copy(update={"key_id": None})
                                  ).enabled_providers()


def dev_endpoints(tls_dir: Path) -> DevEndpoints:
    return DevEndpoints.loopback(fakes_port=2, webhook_port=1, apns_port=3, tls_dir=tls_dir)


def test_dev_credentials_are_a_usable_apns_key(tmp_path: Path) -> None:
    env = dev_environment(dev_endpoints(tmp_path / "tls"))
    assert env["NOTIFLOW_APNS__BASE_URL"] == "https://127.0.0.1:3"
    assert env["NOTIFLOW_FAKES_APNS_PORT"] == "3"
    assert len(env["NOTIFLOW_APNS__TEAM_ID"]) == len(env["NOTIFLOW_APNS__KEY_ID"]) == 10
    config = ApnsSettings(team_id=env["NOTIFLOW_APNS__TEAM_ID"],
                          key_id=env["NOTIFLOW_APNS__KEY_ID"],
                          private_key=SecretStr(env["NOTIFLOW_APNS__PRIVATE_KEY"]))
    assert ProviderTokens.from_settings(config).current()
    assert dev_environment(dev_endpoints(tmp_path / "again"))["NOTIFLOW_APNS__PRIVATE_KEY"] != (
        env["NOTIFLOW_APNS__PRIVATE_KEY"])
    assert Path(env["NOTIFLOW_APNS__CA_FILE"]).parent == tmp_path / "tls"
    assert (Path(env["NOTIFLOW_FAKES_APNS_KEY_FILE"]).stat().st_mode & 0o777) == 0o600
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(env["NOTIFLOW_FAKES_APNS_CERT_FILE"],
                           env["NOTIFLOW_FAKES_APNS_KEY_FILE"])
    client = ssl.create_default_context(cafile=env["NOTIFLOW_APNS__CA_FILE"])
    assert client.verify_mode is ssl.CERT_REQUIRED


# emulator checks ------------------------------------------------------------------------------


def emulator(**knobs: Any) -> ApnsEmulator:
    emu = ApnsEmulator(Settings(apns=CONFIG))
    emu.knobs = emu.knobs.model_copy(update=knobs)
    return emu


def bearer(token: str) -> str:
    return f"bearer {token}"


def test_emulator_checks_the_provider_token() -> None:
    emu, conn = emulator(), TokenState()
    now = datetime.now(UTC)
    other = ec.generate_private_key(ec.SECP256R1())
    assert emu.authorize(conn, None) == (403, "MissingProviderToken")
    assert emu.authorize(conn, "Basic abc") == (403, "MissingProviderToken")
    assert emu.authorize(conn, bearer("garbage")) == (403, "InvalidProviderToken")
    assert emu.authorize(conn, bearer(provider_token(TEAM, KID, other, now))) == (
        403, "InvalidProviderToken")
    assert emu.authorize(conn, bearer(provider_token(TEAM, "OTHERKEY01", KEY, now))) == (
        403, "InvalidProviderToken")
    assert emu.authorize(conn, bearer(provider_token("OTHERTEAM1", KID, KEY, now))) == (
        403, "InvalidProviderToken")
    assert emu.authorize(conn, bearer(provider_token(TEAM, KID, KEY, now + timedelta(
        minutes=10)))) == (403, "InvalidProviderToken")
    assert emu.authorize(conn, bearer(provider_token(TEAM, KID, KEY, now - timedelta(
        minutes=61)))) == (403, "ExpiredProviderToken")
    assert conn.value is None
    good = provider_token(TEAM, KID, KEY, now - timedelta(minutes=30))
    assert emu.authorize(conn, bearer(good)) is None
    assert emu.authorize(conn, f"Bearer {good}") is None
    assert conn.value == good


def test_emulator_limits_token_updates_per_connection() -> None:
    emu, conn = emulator(), TokenState()
    now = datetime.now(UTC)
    old = provider_token(TEAM, KID, KEY, now - timedelta(minutes=10))
    new = provider_token(TEAM, KID, KEY, now)
    assert emu.authorize(conn, bearer(old)) is None
    assert emu.authorize(conn, bearer(new)) == (429, "TooManyProviderTokenUpdates")
    assert emu.authorize(TokenState(), bearer(new)) is None, "another connection"
    older = provider_token(TEAM, KID, KEY, now - timedelta(minutes=31))
    assert emu.authorize(conn, bearer(older)) is None, "not newer: no update to refuse"
    assert emu.authorize(conn, bearer(new)) is None, "30 minutes newer"
    lenient, conn2 = emulator(token_update_min_s=0), TokenState()
    assert lenient.authorize(conn2, bearer(old)) is None
    assert lenient.authorize(conn2, bearer(new)) is None


def test_emulator_expired_tokens_may_be_replaced_at_once() -> None:
    emu, conn = emulator(), TokenState()
    now = datetime.now(UTC)
    first = provider_token(TEAM, KID, KEY, now - timedelta(minutes=1))
    assert emu.authorize(conn, bearer(first)) is None
    emu._expired.update(emu._verified)
    assert emu.authorize(conn, bearer(first)) == (403, "ExpiredProviderToken")
    assert emu.authorize(conn, bearer(provider_token(TEAM, KID, KEY, now))) is None


def _request(token: str = "ab" * 32, *, body: bytes = b'{"aps":{"alert":"hi"}}',
             method: str = "POST", duplicated: frozenset[str] = frozenset(),
             truncated: bool = False, **headers: str) -> Request:
    base = {"authorization": bearer(provider_token(TEAM, KID, KEY, datetime.now(UTC))),
            "apns-topic": CONFIG.topic, "apns-push-type": "alert"}
    base.update({k.replace("_", "-"): v for k, v in headers.items()})
    return Request(method, f"/3/device/{token}", base, duplicated, body, truncated)


@pytest.mark.parametrize(("request_", "status", "reason"), [
    (_request(method="GET"), 405, "MethodNotAllowed"),
    (_request(duplicated=frozenset({"apns-topic"})), 400, "DuplicateHeaders"),
    (_request(""), 400, "MissingDeviceToken"),
    (_request(apns_topic=""), 400, "MissingTopic"),
    (_request(apns_topic="com.example.other"), 400, "TopicDisallowed"),
    (_request(apns_push_type="banner"), 400, "InvalidPushType"),
    (_request(apns_priority="7"), 400, "BadPriority"),
    (_request(apns_expiration="soon"), 400, "BadExpirationDate"),
    (_request(apns_id="not-a-uuid"), 400, "BadMessageId"),
    (_request(apns_collapse_id="c" * 65), 400, "BadCollapseId"),
    (_request("zz" * 32), 400, "BadDeviceToken"),
    (_request("ab" * 16), 400, "BadDeviceToken"),
    (_request(body=b""), 400, "PayloadEmpty"),
    (_request(body=b"x" * 4097, truncated=True), 413, "PayloadTooLarge"),
    (_request("0" * 64), 410, "Unregistered"),
    (_request("bad0" + "1" * 60), 400, "BadDeviceToken"),
    (_request("dead" + "1" * 60), 410, "Unregistered"),
    (_request("deac" + "1" * 60), 410, "ExpiredToken"),
    (_request("f0f0" + "1" * 60), 400, "DeviceTokenNotForTopic"),
    (_request("aaaa" + "1" * 60), 429, "TooManyRequests"),
])
async def test_emulator_request_checks(request_: Request, status: int, reason: str) -> None:
    emu = emulator()
    answer = await emu.answer(TokenState(), request_)
    body = json.loads(answer.body)
    assert (answer.status, body["reason"]) == (status, reason)
    assert ("timestamp" in body) is (status == 410)
    [record] = emu.messages.records
    assert record.error == reason and not record.accepted


async def test_emulator_accepts_and_echoes_apns_id() -> None:
    emu = emulator()
    given = str(uuid.uuid4())
    answer = await emu.answer(TokenState(), _request(apns_id=given.upper(), apns_priority="5"))
    assert (answer.status, answer.apns_id, answer.body) == (200, given, b"")
    generated = await emu.answer(TokenState(), _request())
    assert generated.status == 200 and uuid.UUID(generated.apns_id)
    assert emu.messages.stats()["accepted"] == 2
