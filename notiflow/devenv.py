"""A throw-away development environment: fresh random secrets and demo tenants.

Used by ``notiflow demo`` and the test suite. Secrets are generated at run time and handed
to child processes through their environment; none is stored in the code base.
"""

from __future__ import annotations

import json
import secrets
import socket

from cryptography.fernet import Fernet

DEV_TENANTS = {
    "acme": {"tiers": ["P0", "P1", "P2", "P3"]},
    "globex": {"tiers": ["P0", "P1", "P2", "P3"]},
    "mkt": {"tiers": ["P2", "P3"]},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    }
    env.update(extra or {})
    return env, tokens
