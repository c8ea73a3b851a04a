"""OAuth2 client-credentials JWTs as API credentials (gateway/jwt_auth.py, adapters/jwks.py):
tokens minted by PyJWT as an identity provider would, keys from a JWKS served through httpx's
mock transport."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from datetime import timedelta
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given, settings
from hypothesis import strategies as st
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from notiflow.adapters.jwks import JwksCache, JwksUnavailable
from notiflow.gateway.errors import ApiError
from notiflow.gateway.jwt_auth import looks_like_jwt, principal, verify
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import JwtAuth, TenantConfig
from tests.fakes import ManualClock

ISSUER, AUDIENCE = "https://idp.example.test/", "notiflow-api"
RULE = JwtAuth(jwks_url="https://idp.example.test/jwks", issuer=ISSUER, audience=AUDIENCE)
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ACME = TenantConfig(id="acme", token=None, tiers=frozenset({Tier.P0, Tier.P1, Tier.P2}),
                    templates=frozenset({"otp", "welcome"}))


def b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def jwk(key: Any, kid: str) -> dict[str, Any]:
    algo = RSAAlgorithm if isinstance(key, rsa.RSAPrivateKey) else ECAlgorithm
    data: dict[str, Any] = json.loads(algo.to_jwk(key.public_key()))
    return {**data, "kid": kid, "use": "sig"}


def keyset(*pairs: tuple[Any, str]) -> dict[str, Any]:
    return {"keys": [jwk(k, kid) for k, kid in pairs]}


def token(key: Any = RSA_KEY, kid: str | None = "k1", alg: str = "RS256",
          **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "svc-checkout", "iat": now,
            "exp": now + 300, "scope": "notiflow.send other", "tenant": "acme", **claims}
    body = {k: v for k, v in body.items() if v is not None}
    headers = {"kid": kid} if kid is not None else {}
    return jwt.encode(body, key, algorithm=alg, headers=headers)


def lookup(*pairs: tuple[Any, str]) -> Any:
    keys = {k.key_id: k for k in jwt.PyJWKSet.from_dict(keyset(*pairs)).keys}

    async def key_of(kid: str) -> jwt.PyJWK | None:
        return keys.get(kid)
    return key_of


KEYS = lookup((RSA_KEY, "k1"), (EC_KEY, "e1"))


def refused(tok: str, rule: JwtAuth = RULE, key_of: Any = KEYS) -> ApiError:
    with pytest.raises(ApiError) as info:
        asyncio.run(verify(tok, rule, key_of))
    return info.value


def test_rs256_and_es256_tokens_verify() -> None:
    claims = asyncio.run(verify(token(), RULE, KEYS))
    assert claims["tenant"] == "acme"
    claims = asyncio.run(verify(token(EC_KEY, "e1", "ES256"), RULE, KEYS))
    assert claims["sub"] == "svc-checkout"
    assert looks_like_jwt(token()) and not looks_like_jwt("static-token.with.dots")


@pytest.mark.parametrize(("make", "reason"), [
    (lambda: token(exp=int(time.time()) - 120), "token_expired"),
    (lambda: token(nbf=int(time.time()) + 600), "token_not_yet_valid"),
    (lambda: token(aud="someone-else"), "wrong_audience"),
    (lambda: token(iss="https://evil.example.test/"), "wrong_issuer"),
    (lambda: token(exp=None), "missing_claim"),
    (lambda: token(OTHER_RSA), "bad_signature"),
    (lambda: token(kid="k9"), "unknown_key"),
    (lambda: token(kid=None), "missing_kid"),
    (lambda: token(EC_KEY, "k1", "ES256"), "unsupported_algorithm"),
    (lambda: token(alg="RS512"), "unsupported_algorithm"),
    (lambda: "eyJhbGciOi.not-a-jwt.x", "malformed_token"),
])
def test_a_bad_token_is_refused_with_its_reason(make: Any, reason: str) -> None:
    err = refused(make())
    assert (err.status, err.reason) == (401, reason)
    assert err.headers["WWW-Authenticate"].startswith("Bearer error=")


def test_within_the_leeway_an_expired_token_still_counts() -> None:
    asyncio.run(verify(token(exp=int(time.time()) - 10), RULE, KEYS))
    strict = RULE.model_copy(update={"leeway": timedelta(0)})
    assert refused(token(exp=int(time.time()) - 10), strict).reason == "token_expired"


def test_unsigned_and_shared_secret_tokens_are_refused() -> None:
    unsigned = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": time.time() + 60,
                           "tenant": "acme"}, None, algorithm="none", headers={"kid": "k1"})
    assert refused(unsigned).reason == "unsupported_algorithm"
    public_pem = RSA_KEY.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = b".".join(b64(json.dumps(part).encode()) for part in (
        {"alg": "HS256", "typ": "JWT", "kid": "k1"},
        {"iss": ISSUER, "aud": AUDIENCE, "exp": time.time() + 60, "tenant": "acme"}))
    mac = hmac.new(public_pem, signing_input, hashlib.sha256).digest()
    confused = (signing_input + b"." + b64(mac)).decode()
    assert refused(confused).reason == "unsupported_algorithm"
    with pytest.raises(ValueError):
        JwtAuth(jwks_url="https://idp/jwks", issuer="i", audience="a", algorithms=("HS256",))


def claims(**extra: Any) -> dict[str, Any]:
    return {"tenant": "acme", "scope": "notiflow.send", **extra}


def tenant_of(tenant_id: str) -> TenantConfig | None:
    return ACME if tenant_id == "acme" else None


def test_the_token_acts_as_its_configured_tenant() -> None:
    assert principal(claims(), RULE, tenant_of) is ACME
    assert principal(claims(scope=None, scp=["notiflow.send"]), RULE, tenant_of) is ACME


def test_claims_narrow_the_tenant_and_never_widen_it() -> None:
    p = principal(claims(tiers=["P0", "P3"], channels=["SMS"], templates=["otp", "promo"]),
                  RULE, tenant_of)
    assert p.tiers == {Tier.P0}
    assert p.channels == {Channel.SMS}
    assert p.templates == {"otp"}
    assert p.id == "acme" and ACME.tiers == {Tier.P0, Tier.P1, Tier.P2}


@pytest.mark.parametrize(("extra", "status", "reason"), [
    ({"scope": "other"}, 403, "insufficient_scope"),
    ({"tenant": "globex"}, 403, "unknown_tenant"),
    ({"tenant": None}, 401, "missing_claim"),
    ({"tiers": ["P9"]}, 401, "invalid_claim"),
    ({"channels": "SMS"}, 401, "invalid_claim"),
])
def test_claims_that_do_not_fit_are_refused(extra: dict[str, Any], status: int,
                                            reason: str) -> None:
    with pytest.raises(ApiError) as info:
        principal({k: v for k, v in claims(**extra).items() if v is not None}, RULE,
                  tenant_of)
    assert (info.value.status, info.value.reason) == (status, reason)


def test_a_jwks_url_needs_issuer_and_audience() -> None:
    with pytest.raises(ValueError, match="issuer"):
        JwtAuth(jwks_url="https://idp/jwks")


class Idp:
    """A JWKS endpoint whose keys can rotate and which can fail."""

    def __init__(self, *pairs: tuple[Any, str]) -> None:
        self.body: Any = keyset(*pairs)
        self.status = 200
        self.calls = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return httpx.Response(self.status, json=self.body)


def cache(idp: Idp, clock: ManualClock[float]) -> JwksCache:
    http = httpx.AsyncClient(transport=httpx.MockTransport(idp.handle))
    return JwksCache("https://idp/jwks", http, ttl=600, min_refetch=30, clock=clock)


def test_keys_are_fetched_once_and_reused() -> None:
    idp, clock = Idp((RSA_KEY, "k1")), ManualClock(1000.0)

    async def run() -> None:
        c = cache(idp, clock)
        found = await asyncio.gather(*(c.key("k1") for _ in range(20)))
        assert all(k is not None and k.key_id == "k1" for k in found)
        clock.now += 599
        assert await c.key("k1") is not None
        assert idp.calls == 1
        clock.now += 2
        await c.key("k1")
        assert idp.calls == 2
    asyncio.run(run())


def test_a_rotated_key_is_found_by_one_refetch_and_made_up_ids_cost_little() -> None:
    idp, clock = Idp((RSA_KEY, "k1")), ManualClock(1000.0)

    async def run() -> None:
        c = cache(idp, clock)
        await c.key("k1")
        idp.body = keyset((RSA_KEY, "k1"), (OTHER_RSA, "k2"))
        assert await c.key("k2") is None  # fetched 0 s ago: no refetch yet
        clock.now += 31
        assert (await c.key("k2")) is not None
        assert idp.calls == 2
        for i in range(100):
            assert await c.key(f"made-up-{i}") is None
        assert idp.calls == 2
    asyncio.run(run())


def test_a_failed_fetch_keeps_the_known_keys() -> None:
    idp, clock = Idp((RSA_KEY, "k1")), ManualClock(1000.0)

    async def run() -> None:
        c = cache(idp, clock)
        await c.key("k1")
        idp.status = 503
        clock.now += 700
        assert await c.key("k1") is not None
        idp.status, idp.body = 200, {"keys": "nonsense"}
        clock.now += 700
        assert await c.key("k1") is not None
    asyncio.run(run())


def test_without_any_key_set_the_cache_says_so() -> None:
    idp, clock = Idp(), ManualClock(1000.0)
    idp.status = 500

    async def run() -> None:
        with pytest.raises(JwksUnavailable):
            await cache(idp, clock).key("k1")
    asyncio.run(run())


def test_encryption_keys_are_not_used_for_signatures() -> None:
    idp, clock = Idp(), ManualClock(1000.0)
    idp.body = {"keys": [{**jwk(RSA_KEY, "enc1"), "use": "enc"}, jwk(EC_KEY, "e1")]}

    async def run() -> None:
        c = cache(idp, clock)
        assert await c.key("enc1") is None
        assert await c.key("e1") is not None
    asyncio.run(run())


GOOD = token()


@settings(max_examples=2000, deadline=None)
@given(st.one_of(
    st.text(max_size=400),
    st.builds(lambda i, c: GOOD[:i] + c + GOOD[i + 1:],
              st.integers(0, len(GOOD) - 1), st.characters()),
    st.builds(lambda parts: ".".join(parts), st.lists(st.text(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=", max_size=80),
        min_size=3, max_size=3))))
def test_no_input_escapes_as_anything_but_a_refusal(tok: str) -> None:
    """Whatever the bearer string, verification answers with claims or a 401, never raises
    anything else (which the API would turn into a 500)."""
    try:
        asyncio.run(verify(tok, RULE, KEYS))
    except ApiError as err:
        assert err.status == 401
