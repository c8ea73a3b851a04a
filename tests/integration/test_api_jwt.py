"""OAuth2 client-credentials JWTs against the real API process: an identity provider's JWKS
served over HTTP on loopback, tokens minted by PyJWT, keys rotated by ``kid``; static tokens
switched off."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.helpers import hold

pytestmark = pytest.mark.integration

ISSUER, AUDIENCE = "https://idp.notiflow.test/", "notiflow-api"
MIN_REFETCH_S = 1
PAST_MIN_REFETCH_S = MIN_REFETCH_S + 0.2
"""Long enough for the API's JWKS refetch limit to have lapsed (the API's own timer)."""


class Idp:
    """The identity provider: signs tokens, publishes its public keys at ``/jwks``."""

    def __init__(self) -> None:
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.fetches = 0
        self.rotate("k1")
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                idp.fetches += 1
                body = json.dumps({"keys": [
                    {**json.loads(RSAAlgorithm.to_jwk(k.public_key())), "kid": kid,
                     "use": "sig", "alg": "RS256"} for kid, k in idp.keys.items()]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rotate(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def token(self, kid: str = "k1", **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "svc-checkout", "iat": now,
                "exp": now + 300, "scope": "notiflow.send", "tenant": "acme", **claims}
        return jwt.encode(body, self.keys[kid], algorithm="RS256", headers={"kid": kid})


@pytest.fixture
def idp() -> Iterator[Idp]:
    server = Idp()
    yield server
    server.server.shutdown()


def sms(tier: str, version: int) -> dict[str, Any]:
    return {"channel": "SMS", "tier": tier, "recipient": "+14155550123",
            "template_id": "otp", "template_version": version,
            "variables": {"code": "123456"}}


def test_jwt_callers_send_as_their_tenant_within_their_claims(
        isolated: Callable[..., Any], idp: Idp, otp_template: dict[str, int],
        tokens: dict[str, str]) -> None:
    iso = isolated(f"jwt{uuid.uuid4().hex[:6]}", NOTIFLOW_JWT__JWKS_URL=idp.url,
                   NOTIFLOW_JWT__ISSUER=ISSUER, NOTIFLOW_JWT__AUDIENCE=AUDIENCE,
                   NOTIFLOW_JWT__MIN_REFETCH=f"PT{MIN_REFETCH_S}S",
                   NOTIFLOW_JWT__STATIC_TOKENS="false")
    base = iso.api()
    version = otp_template["acme"]

    def post(tok: str, tier: str = "P1") -> httpx.Response:
        return httpx.post(f"{base}/v1/messages", json=sms(tier, version), timeout=15,
                          headers={"Authorization": f"Bearer {tok}",
                                   "Idempotency-Key": uuid.uuid4().hex})

    narrow = idp.token(tiers=["P1"])
    ok = post(narrow)
    assert ok.status_code == 202, ok.text
    got = httpx.get(f"{base}/v1/messages/{ok.json()['message_id']}", timeout=10,
                    headers={"Authorization": f"Bearer {narrow}"})
    assert got.status_code == 200 and got.json()["tier"] == "P1"

    p0 = post(narrow, "P0")
    assert (p0.status_code, p0.json()["reason"]) == (403, "tier_not_allowed")

    as_acme = idp.token(senders=["ACME"])
    for sender, status in (("ACME", 202), ("+14155550100", 403)):
        r = httpx.post(f"{base}/v1/messages", json={**sms("P1", version), "sender": sender},
                       timeout=15, headers={"Authorization": f"Bearer {as_acme}"})
        assert r.status_code == status, (sender, r.text)
    assert r.json()["reason"] == "sender_not_allowed"

    expired = post(idp.token(exp=int(time.time()) - 600))
    assert (expired.status_code, expired.json()["reason"]) == (401, "token_expired")
    assert expired.headers["WWW-Authenticate"].startswith("Bearer error=")

    unscoped = post(idp.token(scope="other"))
    assert (unscoped.status_code, unscoped.json()["reason"]) == (403, "insufficient_scope")

    stranger = post(idp.token(tenant="globex-unknown"))
    assert (stranger.status_code, stranger.json()["reason"]) == (403, "unknown_tenant")

    static = post(tokens["acme"])
    assert (static.status_code, static.json()["reason"]) == (401, "unknown_token")

    fetches = idp.fetches
    idp.rotate("k2")
    hold(PAST_MIN_REFETCH_S)
    rotated = post(idp.token("k2"))
    assert rotated.status_code == 202, rotated.text
    assert idp.fetches == fetches + 1
    assert post(idp.token("k1")).status_code == 202
    assert idp.fetches == fetches + 1

    intruder = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    made_up = [jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 60,
                           "scope": "notiflow.send", "tenant": "acme"}, intruder,
                          algorithm="RS256", headers={"kid": f"x{i}"}) for i in range(20)]
    hold(PAST_MIN_REFETCH_S)
    fetches = idp.fetches
    started = time.monotonic()
    for tok in made_up:
        r = post(tok)
        assert (r.status_code, r.json()["reason"]) == (401, "unknown_key")
    intervals = int((time.monotonic() - started) / MIN_REFETCH_S)
    assert idp.fetches <= fetches + 1 + intervals < fetches + len(made_up), (
        "one fetch per min_refetch at most, however many unknown key ids arrive")
