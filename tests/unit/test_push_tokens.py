"""The push adapters' JWTs checked by independent implementations (PyJWT, and google-auth for
the FCM assertion), and the emulators' token verification refusing what the real services
refuse (pure; no network, no running stack)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import google.auth.crypt
import google.auth.exceptions
import google.auth.jwt
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from pydantic import SecretStr

from notiflow.providers.apns.config import ApnsSettings
from notiflow.providers.apns.emulator import ApnsEmulator, TokenState, verify_provider_token
from notiflow.providers.apns.tokens import provider_token
from notiflow.providers.fcm.emulator import (
    BAD_AUDIENCE,
    BAD_SIGNATURE,
    SHORT_LIVED,
    UNKNOWN_ACCOUNT,
    GrantRefused,
    verify_assertion,
)
from notiflow.providers.fcm.tokens import SCOPE, ServiceAccount, service_account_assertion
from notiflow.settings import Settings

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
RSA_OTHER = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
EC_OTHER = ec.generate_private_key(ec.SECP256R1())
EMAIL = "sender@proj.iam.gserviceaccount.com"
TOKEN_URI = "https://oauth2.example.test/token"
KEY_ID = "kid-1"
TEAM, KID = "TEAM000001", "KEY0000001"


def _public_pem(key: rsa.RSAPrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _account(key: rsa.RSAPrivateKey = RSA_KEY, key_id: str | None = KEY_ID) -> ServiceAccount:
    return ServiceAccount(EMAIL, key, TOKEN_URI, key_id)


def _b64(part: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(part).encode()).rstrip(b"=").decode()


def _claims(now: datetime, **changes: Any) -> dict[str, Any]:
    iat = int(now.timestamp())
    return {"iss": EMAIL, "scope": SCOPE, "aud": TOKEN_URI, "iat": iat, "exp": iat + 3600,
            **changes}


def _refusal(assertion: str, key: rsa.RSAPrivateKey = RSA_KEY) -> str:
    with pytest.raises(GrantRefused) as refused:
        verify_assertion(assertion, key.public_key(), issuer=EMAIL, audience=TOKEN_URI)
    return refused.value.description


# FCM service-account assertion ------------------------------------------------------------


def test_fcm_assertion_verifies_with_pyjwt_and_carries_kid() -> None:
    now = datetime.now(UTC)
    token = service_account_assertion(_account(), now)
    assert jwt.get_unverified_header(token) == {"alg": "RS256", "typ": "JWT", "kid": KEY_ID}
    claims = jwt.decode(token, RSA_KEY.public_key(), algorithms=["RS256"], audience=TOKEN_URI,
                        issuer=EMAIL, options={"require": ["iss", "aud", "iat", "exp"],
                                               "strict_aud": True})
    assert claims == _claims(now)
    assert "kid" not in jwt.get_unverified_header(
        service_account_assertion(_account(key_id=None), now))


def test_fcm_assertion_verifies_with_google_auth() -> None:
    now = datetime.now(UTC)
    token = service_account_assertion(_account(), now)
    claims = google.auth.jwt.decode(token, certs={KEY_ID: _public_pem(RSA_KEY)},
                                    audience=TOKEN_URI)
    assert claims == _claims(now)
    with pytest.raises(google.auth.exceptions.GoogleAuthError):
        google.auth.jwt.decode(token, certs={KEY_ID: _public_pem(RSA_OTHER)},
                               audience=TOKEN_URI)
    with pytest.raises(google.auth.exceptions.GoogleAuthError):
        google.auth.jwt.decode(token, certs={"kid-2": _public_pem(RSA_KEY)}, audience=TOKEN_URI)


def test_fcm_emulator_accepts_adapter_and_google_auth_assertions() -> None:
    now = datetime.now(UTC)
    ours = service_account_assertion(_account(), now)
    assert verify_assertion(ours, RSA_KEY.public_key(), issuer=EMAIL,
                            audience=TOKEN_URI) == _claims(now)
    pem = RSA_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    signer = google.auth.crypt.RSASigner.from_string(pem, KEY_ID)
    theirs = google.auth.jwt.encode(signer, _claims(now)).decode()
    assert verify_assertion(theirs, RSA_KEY.public_key(), issuer=EMAIL,
                            audience=TOKEN_URI)["aud"] == TOKEN_URI


def test_fcm_emulator_refuses_forged_assertions() -> None:
    now = datetime.now(UTC)
    token = service_account_assertion(_account(), now)
    head, body, sig = token.split(".")
    assert _refusal(service_account_assertion(_account(RSA_OTHER), now)) == BAD_SIGNATURE
    assert _refusal(f"{head}.{_b64(_claims(now, scope='x'))}.{sig}") == BAD_SIGNATURE
    for alg in ("none", "HS256", "RS512"):
        assert _refusal(f"{_b64({'alg': alg, 'typ': 'JWT'})}.{body}.{sig}") == BAD_SIGNATURE
    assert _refusal(f"{head}.{body}.") == BAD_SIGNATURE
    for junk in ("a.b", "not-a-jwt", "!!.??.**"):
        assert _refusal(junk) == BAD_SIGNATURE
    with pytest.raises(GrantRefused, match="account not found"):
        verify_assertion(token, None, issuer=EMAIL, audience=TOKEN_URI)


@pytest.mark.parametrize(("changes", "description"), [
    ({"iss": "someone@else.iam.gserviceaccount.com"}, UNKNOWN_ACCOUNT),
    ({"aud": "https://example.com/token"}, BAD_AUDIENCE),
    ({"aud": [TOKEN_URI]}, BAD_AUDIENCE),
    ({"aud": None}, BAD_AUDIENCE),
    ({"iat": -7200, "exp": -3600}, SHORT_LIVED),
    ({"exp": 7200}, SHORT_LIVED),
    ({"exp": 0}, SHORT_LIVED),
    ({"iat": 600, "exp": 3600}, SHORT_LIVED),
    ({"iat": 0.5}, SHORT_LIVED),
    ({"exp": None}, SHORT_LIVED),
], ids=["issuer", "audience", "audience-list", "no-audience", "expired", "too-long",
        "exp-not-after-iat", "iat-in-future", "float-iat", "no-exp"])
def test_fcm_emulator_refuses_bad_claims(changes: dict[str, Any], description: str) -> None:
    now = datetime.now(UTC)
    base = int(now.timestamp())
    claims = _claims(now)
    for name, value in changes.items():
        if name in ("iat", "exp") and isinstance(value, int | float):
            value = base + value
        if value is None:
            claims.pop(name)
        else:
            claims[name] = value
    assertion = jwt.encode(claims, RSA_KEY, algorithm="RS256", headers={"kid": KEY_ID})
    assert _refusal(assertion) == description


def test_fcm_emulator_tolerates_small_clock_skew() -> None:
    now = datetime.now(UTC)
    ahead = service_account_assertion(_account(), now + timedelta(minutes=4))
    assert verify_assertion(ahead, RSA_KEY.public_key(), issuer=EMAIL, audience=TOKEN_URI)
    beyond = service_account_assertion(_account(), now + timedelta(minutes=6))
    assert _refusal(beyond) == SHORT_LIVED


# APNs provider token ----------------------------------------------------------------------


def test_apns_token_verifies_with_pyjwt_and_carries_kid() -> None:
    now = datetime.now(UTC)
    token = provider_token(TEAM, KID, EC_KEY, now)
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "kid": KID}
    claims = jwt.decode(token, EC_KEY.public_key(), algorithms=["ES256"], issuer=TEAM,
                        options={"require": ["iss", "iat"]})
    assert claims == {"iss": TEAM, "iat": int(now.timestamp())}
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, EC_OTHER.public_key(), algorithms=["ES256"])


def _verify(token: str) -> int:
    return verify_provider_token(token, EC_KEY.public_key(), key_id=KID, team_id=TEAM)


def test_apns_emulator_verification_accepts_and_refuses() -> None:
    now = datetime.now(UTC)
    token = provider_token(TEAM, KID, EC_KEY, now)
    assert _verify(token) == int(now.timestamp())
    head, _, sig = token.split(".")
    iat = int(now.timestamp())
    refused = [
        provider_token(TEAM, KID, EC_OTHER, now),
        provider_token(TEAM, "OTHERKEY01", EC_KEY, now),
        provider_token("OTHERTEAM1", KID, EC_KEY, now),
        provider_token(TEAM, KID, EC_KEY, now + timedelta(minutes=10)),
        f"{head}.{_b64({'iss': TEAM, 'iat': iat + 1})}.{sig}",
        f"{_b64({'alg': 'HS256', 'kid': KID})}.{token.split('.')[1]}.{sig}",
        jwt.encode({"iss": TEAM, "iat": iat}, EC_KEY, algorithm="ES256"),
        jwt.encode({"iss": TEAM, "iat": float(iat)}, EC_KEY, algorithm="ES256",
                   headers={"kid": KID}),
        jwt.encode({"iss": TEAM}, EC_KEY, algorithm="ES256", headers={"kid": KID}),
        f"{head}.{token.split('.')[1]}.",
        "garbage",
    ]
    for bad in refused:
        with pytest.raises(jwt.InvalidTokenError):
            _verify(bad)


def test_apns_emulator_refuses_expired_and_forged_tokens() -> None:
    pem = EC_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption()).decode()
    emulator = ApnsEmulator(Settings(apns=ApnsSettings(team_id=TEAM, key_id=KID,
                                                       private_key=SecretStr(pem))))
    now = datetime.now(UTC)

    def authorize(token: str) -> tuple[int, str] | None:
        return emulator.authorize(TokenState(), f"bearer {token}")

    assert authorize(provider_token(TEAM, KID, EC_KEY, now - timedelta(minutes=59))) is None
    assert authorize(provider_token(TEAM, KID, EC_KEY, now - timedelta(minutes=61))) == (
        403, "ExpiredProviderToken")
    assert authorize(provider_token(TEAM, KID, EC_OTHER, now)) == (403, "InvalidProviderToken")
    good = provider_token(TEAM, KID, EC_KEY, now)
    head, _, sig = good.split(".")
    tampered = f"{head}.{_b64({'iss': TEAM, 'iat': int(now.timestamp()) - 1})}.{sig}"
    assert authorize(tampered) == (403, "InvalidProviderToken")
