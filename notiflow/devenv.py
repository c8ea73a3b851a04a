"""A throw-away development environment: fresh random secrets and demo tenants.

Used by ``notiflow demo`` and the test suite. Secrets are generated at run time and handed
to child processes through their environment; none is stored in the code base.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import string
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from notiflow.extras import needs

SES_TOPIC = "arn:aws:sns:us-east-1:000000000000:notiflow-ses-events"
"""The SNS topic of SES events in the development environment (the SES emulator's)."""
DEV_TENANTS: dict[str, dict[str, object]] = {
    "acme": {"tiers": ["P0", "P1", "P2", "P3"],
             "senders": ["ACME", "+14155550100", "@acme.example"]},
    "globex": {"tiers": ["P0", "P1", "P2", "P3"]},
    "mkt": {"tiers": ["P2", "P3"]},
    "promo": {"tiers": ["P3"], "max_active_campaigns": 2, "max_campaign_recipients": 100_000},
}
LOOPBACK_EGRESS: dict[str, str] = {
    "NOTIFLOW_EGRESS__ALLOW_HTTP": "true",
    "NOTIFLOW_EGRESS__ALLOW_NETWORKS": '["127.0.0.0/8", "::1/128"]',
}
"""Tenant webhooks may reach the loopback receivers and emulators over http (development and
tests only; the defaults allow neither)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _apple_id() -> str:
    """A random 10-character identifier shaped like Apple's team and key ids."""
    alphabet = string.ascii_uppercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(10))


def apns_tls_files(directory: Path) -> dict[str, str]:
    """A throw-away test CA and a server certificate for ``127.0.0.1``/``localhost`` (made with
    ``trustme``), written to ``directory`` (key file mode 0600); returns the variables that
    point the APNs emulator at its certificate and the adapter at the CA."""
    with needs("emulators", "the APNs emulator's TLS files"):
        import trustme
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="notiflow dev CA")
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = (directory / "apns-ca.pem", directory / "apns-emulator.pem",
                                    directory / "apns-emulator.key")
    ca.cert_pem.write_to_path(str(ca_file))
    cert_file.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key_file.touch(mode=0o600)
    key_file.chmod(0o600)
    leaf.private_key_pem.write_to_path(str(key_file))
    return {
        "NOTIFLOW_APNS__CA_FILE": str(ca_file),
        "NOTIFLOW_FAKES_APNS_CERT_FILE": str(cert_file),
        "NOTIFLOW_FAKES_APNS_KEY_FILE": str(key_file),
    }


def provider_credentials(*, api_port: int, fakes_port: int,
                         apns_port: int = 18443) -> dict[str, str]:
    """Fresh SendGrid, FCM and APNs dev credentials, pointed at ``notiflow fakes``: a random API
    key, an ECDSA P-256 Event Webhook key pair, an FCM service account with a new RSA key, and
    an APNs team id, key id and EC P-256 signing key (the emulators derive the public keys
    from the same variables). The APNs emulator's TLS files come from :func:`apns_tls_files`.
    Also the key pair the SES emulator accepts; SES itself stays off (``ses.access_key_id``
    unset), so the email routes are those of SendGrid and SMTP. The SES emulator's SNS topic
    delivers to the API's ``/webhooks/ses``, which takes certificates from the emulator's
    loopback host over HTTP and SHA-1 signatures too (the emulator signs with either; the
    third-party validator the tests check its posts with knows SHA-1 only)."""
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
        "NOTIFLOW_SES__ENDPOINT_URL": f"{fakes}/ses",
        "NOTIFLOW_FAKES_SES_ACCESS_KEY_ID": "AKIA" + "".join(
            secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16)),
        "NOTIFLOW_FAKES_SES_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "NOTIFLOW_SES__SNS_TOPIC_ARNS": f'["{SES_TOPIC}"]',
        "NOTIFLOW_SES__SNS_HOST_PATTERN": r"127\.0\.0\.1",
        "NOTIFLOW_SES__SNS_REQUIRE_HTTPS": "false",
        "NOTIFLOW_SES__SNS_SIGNATURE_V1": "true",
        "NOTIFLOW_FAKES_SES_SNS_ENDPOINT_URL": f"http://127.0.0.1:{api_port}/webhooks/ses",
        "NOTIFLOW_SLACK__WEBHOOK_PREFIXES": f'["{fakes}/slack/services/"]',
        "NOTIFLOW_TEAMS__WEBHOOK_PREFIXES": (f'["{fakes}/teams/workflows/", '
                                             f'"{fakes}/teams/webhookb2/"]'),
        "NOTIFLOW_FCM__BASE_URL": f"{fakes}/fcm",
        "NOTIFLOW_FCM__TOKEN_URI": f"{fakes}/fcm/token",
        "NOTIFLOW_FCM__PROJECT_ID": project,
        "NOTIFLOW_FCM__CLIENT_EMAIL": f"notiflow-sender@{project}.iam.gserviceaccount.com",
        "NOTIFLOW_FCM__PRIVATE_KEY": _pem(account_key),
        "NOTIFLOW_FCM__PRIVATE_KEY_ID": secrets.token_hex(20),
        "NOTIFLOW_APNS__BASE_URL": f"https://127.0.0.1:{apns_port}",
        "NOTIFLOW_APNS__TEAM_ID": _apple_id(),
        "NOTIFLOW_APNS__KEY_ID": _apple_id(),
        "NOTIFLOW_APNS__PRIVATE_KEY": _pem(ec.generate_private_key(ec.SECP256R1())),
    }


def vonage_smtp_credentials(*, fakes_port: int, smtp_port: int | None = None) -> dict[str, str]:
    """Fresh Vonage and SMTP dev credentials, pointed at ``notiflow fakes``: a Vonage API key,
    API secret and signature secret (the emulator checks requests and signs delivery receipts
    with them), an SMTP username and password with the SMTP emulator's port (default: a free
    port) for both the emulator and the adapter, and the bearer secret of the DSN webhook."""
    smtp_port = smtp_port if smtp_port is not None else free_port()
    return {
        "NOTIFLOW_VONAGE__BASE_URL": f"http://127.0.0.1:{fakes_port}/vonage",
        "NOTIFLOW_VONAGE__API_KEY": secrets.token_hex(4),
        "NOTIFLOW_VONAGE__API_SECRET": secrets.token_urlsafe(12),
        "NOTIFLOW_VONAGE__SIGNATURE_SECRET": secrets.token_urlsafe(32),
        "NOTIFLOW_FAKES_SMTP_PORT": str(smtp_port),
        "NOTIFLOW_SMTP__HOST": "127.0.0.1",
        "NOTIFLOW_SMTP__PORT": str(smtp_port),
        "NOTIFLOW_SMTP__USERNAME": f"notiflow-{secrets.token_hex(3)}",
        "NOTIFLOW_SMTP__PASSWORD": secrets.token_urlsafe(18),
        "NOTIFLOW_SMTP__DSN_WEBHOOK_SECRET": secrets.token_urlsafe(32),
    }


def webhook_secret() -> str:
    """A Standard Webhooks signing secret: ``whsec_`` + base64 of 24 random bytes."""
    import base64

    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def object_store_credentials(stack_dir: Path) -> dict[str, str]:
    """The local stack's S3 credentials (its SeaweedFS refuses unsigned requests): a random
    access key id and secret made once per stack directory and kept in
    ``conf/s3-credentials.json`` there (mode 0600), so the stack and every dev, demo or test
    process agree; returned as the variables that configure the object store."""
    path = stack_dir / "conf" / "s3-credentials.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = {"access_key_id": "NF" + secrets.token_hex(9).upper(),
                 "secret_access_key": secrets.token_urlsafe(30)}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(fresh, f)
        try:
            os.link(tmp, path)  # atomic: a concurrent first caller's file wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    creds = json.loads(path.read_text())
    return {"NOTIFLOW_OBJECT_STORE__ACCESS_KEY_ID": creds["access_key_id"],
            "NOTIFLOW_OBJECT_STORE__SECRET_ACCESS_KEY": creds["secret_access_key"]}


def dev_environment(*, api_port: int, fakes_port: int, time_scale: float = 1.0,
                    extra: dict[str, str] | None = None, apns_port: int | None = None,
                    tls_dir: Path | None = None,
                    webhook_port: int | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Return (NOTIFLOW_* environment, tenant id -> bearer token). The APNs emulator gets
    ``apns_port`` (default: a free port) and TLS files in ``tls_dir`` (default: a new
    temporary directory); the emulators post receipts to the API on ``webhook_port``
    (default ``api_port``; the bulk lane's API when the lanes run apart). The object store's
    credentials are the local stack's (:func:`object_store_credentials`, stack directory
    from ``extra`` or the environment's ``NOTIFLOW_STACK_DIR``, default ``.stack``). Ingest
    records must be bound (``notiflow/ingest_binding.py``): a fresh platform key, and a fresh
    ``ingest_keys`` entry per tenant for direct producers."""
    stack_dir = Path((extra or {}).get("NOTIFLOW_STACK_DIR")
                     or os.environ.get("NOTIFLOW_STACK_DIR") or ".stack")
    apns_port = apns_port if apns_port is not None else free_port()
    hooks = webhook_port if webhook_port is not None else api_port
    tls_dir = tls_dir if tls_dir is not None else Path(tempfile.mkdtemp(prefix="notiflow-tls-"))
    tokens = {tid: f"nf_{tid}_{secrets.token_urlsafe(24)}" for tid in DEV_TENANTS}
    tenants: list[dict[str, object]] = [
        {"id": tid, "token": tokens[tid], "webhook_secrets": [webhook_secret()],
         "inbox_keys": [secrets.token_urlsafe(32)],
         "ingest_keys": [secrets.token_urlsafe(32)], **cfg}
        for tid, cfg in DEV_TENANTS.items()]
    env = {
        "NOTIFLOW_ENVIRONMENT": "development",
        "NOTIFLOW_TENANTS": json.dumps(tenants),
        "NOTIFLOW_API_PORT": str(api_port),
        "NOTIFLOW_FAKES_PORT": str(fakes_port),
        "NOTIFLOW_TWILIO__BASE_URL": f"http://127.0.0.1:{fakes_port}/twilio",
        "NOTIFLOW_TWILIO__ACCOUNT_SID": "AC" + secrets.token_hex(16),
        "NOTIFLOW_TWILIO__AUTH_TOKEN": secrets.token_hex(16),
        "NOTIFLOW_TWILIO__STATUS_CALLBACK_URL": f"http://127.0.0.1:{hooks}/webhooks/twilio",
        "NOTIFLOW_DLQ_KEY": Fernet.generate_key().decode(),
        "NOTIFLOW_RECIPIENT_HASH_KEY": secrets.token_urlsafe(32),
        "NOTIFLOW_INGEST_BINDING__KEYS": secrets.token_urlsafe(32),
        "NOTIFLOW_INGEST_BINDING__REQUIRED": "true",
        "NOTIFLOW_INGEST_ENCRYPTION__KEYS": "dev1:" + base64.urlsafe_b64encode(
            os.urandom(32)).rstrip(b"=").decode(),
        **object_store_credentials(stack_dir),
        "NOTIFLOW_TIME_SCALE": str(time_scale),
        "NOTIFLOW_FAKES_APNS_PORT": str(apns_port),
        **provider_credentials(api_port=hooks, fakes_port=fakes_port, apns_port=apns_port),
        **apns_tls_files(tls_dir),
        **vonage_smtp_credentials(fakes_port=fakes_port),
        "NOTIFLOW_VONAGE__STATUS_CALLBACK_URL": f"http://127.0.0.1:{hooks}/webhooks/vonage",
        "NOTIFLOW_SMTP__DSN_WEBHOOK_URL": f"http://127.0.0.1:{hooks}/webhooks/smtp-dsn",
        **LOOPBACK_EGRESS,
    }
    env.update(extra or {})
    return env, tokens
