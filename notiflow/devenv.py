"""A throw-away development environment: fresh random secrets and demo tenants; each
provider's part comes from its plug-in (``SPEC.dev_environment``).

Used by ``notiflow demo`` and the test suite. Secrets are generated at run time and handed
to child processes through their environment; none is stored in the code base.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path

from cryptography.fernet import Fernet
from pydantic import BaseModel

from notiflow.adapters.providers import provider_specs
from notiflow.adapters.providers.base import DevEndpoints
from notiflow.settings import Settings

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


def provider_environment(settings_type: type[BaseModel],
                         endpoints: DevEndpoints) -> dict[str, str]:
    """The union of the development environments of ``settings_type``'s provider plug-ins
    (each ``SPEC.dev_environment``), in registry order; raises ``ValueError`` when two
    plug-ins set the same variable."""
    env: dict[str, str] = {}
    for name, spec in provider_specs(settings_type).items():
        if spec.dev_environment is None:
            continue
        part = spec.dev_environment()(endpoints)
        if clash := env.keys() & part.keys():
            raise ValueError(f"the {name} plug-in sets {sorted(clash)} again")
        env.update(part)
    return env


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


def _temporary_dir(prefix: str) -> Path:
    """A new private directory, removed with its files when this process exits (its
    children, which read the files at start, exit first)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def dev_environment(*, api_port: int, fakes_port: int, time_scale: float = 1.0,
                    extra: dict[str, str] | None = None, apns_port: int | None = None,
                    tls_dir: Path | None = None,
                    webhook_port: int | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Return (NOTIFLOW_* environment, tenant id -> bearer token). The providers' part is
    :func:`provider_environment` of the registry's plug-ins. The APNs emulator gets
    ``apns_port`` (default: a free port) and TLS files in ``tls_dir`` (default: a new
    temporary directory, removed when this process exits); the emulators post receipts to
    the API on ``webhook_port`` (default ``api_port``; the bulk lane's API when the lanes run
    apart). The object store's credentials are the local stack's
    (:func:`object_store_credentials`, stack directory from ``extra`` or the environment's
    ``NOTIFLOW_STACK_DIR``, default ``.stack``). Unsubscribe links point at the API on
    ``webhook_port`` (the lane serving them). Ingest records must be bound
    (``notiflow/ingest_binding.py``): a fresh platform key, and a fresh ``ingest_keys`` entry
    per tenant for direct producers."""
    stack_dir = Path((extra or {}).get("NOTIFLOW_STACK_DIR")
                     or os.environ.get("NOTIFLOW_STACK_DIR") or ".stack")
    apns_port = apns_port if apns_port is not None else free_port()
    hooks = webhook_port if webhook_port is not None else api_port
    tls_dir = tls_dir if tls_dir is not None else _temporary_dir("notiflow-tls-")
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
        "NOTIFLOW_DLQ_KEY": Fernet.generate_key().decode(),
        "NOTIFLOW_RECIPIENT_HASH_KEY": secrets.token_urlsafe(32),
        "NOTIFLOW_INGEST_BINDING__KEYS": secrets.token_urlsafe(32),
        "NOTIFLOW_INGEST_BINDING__REQUIRED": "true",
        "NOTIFLOW_INGEST_ENCRYPTION__KEYS": "dev1:" + base64.urlsafe_b64encode(
            os.urandom(32)).rstrip(b"=").decode(),
        **object_store_credentials(stack_dir),
        "NOTIFLOW_TIME_SCALE": str(time_scale),
        "NOTIFLOW_UNSUBSCRIBE__BASE_URL": f"http://127.0.0.1:{hooks}",
        "NOTIFLOW_UNSUBSCRIBE__MAILTO": "unsubscribe@notiflow.example",
        "NOTIFLOW_PREFERENCE_PAGE__BASE_URL": f"http://127.0.0.1:{hooks}",
        **provider_environment(Settings, DevEndpoints.loopback(
            fakes_port=fakes_port, webhook_port=hooks, apns_port=apns_port, tls_dir=tls_dir)),
        **LOOPBACK_EGRESS,
    }
    env.update(extra or {})
    return env, tokens
