"""Vonage's development environment."""

from __future__ import annotations

import secrets

from notiflow.adapters.providers.base import DevEndpoints


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """A random API key, API secret and signature secret (the emulator checks requests and
    signs delivery receipts with them); receipts go to the API's ``/webhooks/vonage``."""
    return {
        "NOTIFLOW_VONAGE__BASE_URL": f"{endpoints.fakes_url}/vonage",
        "NOTIFLOW_VONAGE__API_KEY": secrets.token_hex(4),
        "NOTIFLOW_VONAGE__API_SECRET": secrets.token_urlsafe(12),
        "NOTIFLOW_VONAGE__SIGNATURE_SECRET": secrets.token_urlsafe(32),
        "NOTIFLOW_VONAGE__STATUS_CALLBACK_URL": f"{endpoints.webhook_url}/webhooks/vonage",
    }
