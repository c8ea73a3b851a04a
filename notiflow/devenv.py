"""A throw-away development environment: fresh random secrets and demo tenants.

Used by ``notiflow demo`` and the test suite. Secrets are generated at run time and handed
to child processes through their environment; none is stored in the code base.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

DEV_TENANTS = {
    "acme": {"tiers": ["P0", "P1", "P2", "P3"]},
    "globex": {"tiers": ["P0", "P1", "P2", "P3"]},
    "mkt": {"tiers": ["P2", "P3"]},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def provider_credentials(*, api_port: int, fakes_port: int) -> dict[str, str]:
    """Fresh SendGrid and FCM dev credentials, pointed at ``notiflow fakes``: a random API key,
    an ECDSA P-256 Event Webhook key pair, and an FCM service account with a new RSA key (the
    emulator derives the public key from the same variables)."""
    fakes = f"http://127.0.0.1:{fakes_port}"
    webhook_key = ec.generate_private_key(ec.SECP256R1())
    webhook_public = webhook_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    project = f"notiflow-dev-{secrets.token_hex(3)}"
    account_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return {
        "NOTIFLOW_SENDGRID__BASE_URL": f"{fakes}/sendgrid",
        "NOTIFLOW_SENDGRID__API_KEY": (f"SG.{secrets.token_urlsafe(16)}."
                                       f"{secrets.token_urlsafe(32)}"),
        "NOTIFLOW_SENDGRID__EVENT_WEBHOOK_URL": f"http://127.0.0.1:{api_port}/webhooks/sendgrid",
        "NOTIFLOW_SENDGRID__EVENT_WEBHOOK_PUBLIC_KEY": base64.b64encode(webhook_public).decode(),
        "NOTIFLOW_SENDGRID__EVENT_WEBHOOK_SIGNING_KEY": _pem(webhook_key),
        "NOTIFLOW_FCM__BASE_URL": f"{fakes}/fcm",
        "NOTIFLOW_FCM__TOKEN_URI": f"{fakes}/fcm/token",
        "NOTIFLOW_FCM__PROJECT_ID": project,
        "NOTIFLOW_FCM__CLIENT_EMAIL": f"notiflow-sender@{project}.iam.gserviceaccount.com",
        "NOTIFLOW_FCM__PRIVATE_KEY": _pem(account_key),
        "NOTIFLOW_FCM__PRIVATE_KEY_ID": secrets.token_hex(20),
    }


def dev_environment(*, api_port: int, fakes_port: int, time_scale: float = 1.0,
                    extra: dict[str, str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Return (NOTIFLOW_* environment, tenant id -> bearer token)."""
    tokens = {tid: f"nf_{tid}_{secrets.token_urlsafe(24)}" for tid in DEV_TENANTS}
    tenants = [{"id": tid, "token": tokens[tid], **cfg} for tid, cfg in DEV_TENANTS.items()]
    env = {
        "NOTIFLOW_TENANTS": json.dumps(tenants),
        "NOTIFLOW_API_PORT": str(api_port),
        "NOTIFLOW_FAKES_PORT": str(fakes_port),
        "NOTIFLOW_TWILIO__BASE_URL": f"http://127.0.0.1:{fakes_port}/twilio",
        "NOTIFLOW_TWILIO__ACCOUNT_SID": "AC" + secrets.token_hex(16),
        "NOTIFLOW_TWILIO__AUTH_TOKEN": secrets.token_hex(16),
        "NOTIFLOW_TWILIO__STATUS_CALLBACK_URL": f"http://127.0.0.1:{api_port}/webhooks/twilio",
        "NOTIFLOW_DLQ_KEY": Fernet.generate_key().decode(),
        "NOTIFLOW_TIME_SCALE": str(time_scale),
        **provider_credentials(api_port=api_port, fakes_port=fakes_port),
    }
    env.update(extra or {})
    return env, tokens
