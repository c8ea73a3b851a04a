"""SMTP's development environment."""

from __future__ import annotations

import secrets

from notiflow.adapters.providers.base import DevEndpoints
from notiflow.devenv import free_port


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """A random username and password, a free port for the SMTP emulator (the emulator's and
    the adapter's), and the DSN webhook's bearer secret; the emulator's DSNs go to the API's
    ``/webhooks/smtp-dsn``."""
    port = str(free_port())
    return {
        "NOTIFLOW_FAKES_SMTP_PORT": port,
        "NOTIFLOW_SMTP__HOST": "127.0.0.1",
        "NOTIFLOW_SMTP__PORT": port,
        "NOTIFLOW_SMTP__USERNAME": f"notiflow-{secrets.token_hex(3)}",
        "NOTIFLOW_SMTP__PASSWORD": secrets.token_urlsafe(18),
        "NOTIFLOW_SMTP__DSN_WEBHOOK_SECRET": secrets.token_urlsafe(32),
        "NOTIFLOW_SMTP__DSN_WEBHOOK_URL": f"{endpoints.webhook_url}/webhooks/smtp-dsn",
    }
