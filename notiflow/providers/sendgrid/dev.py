"""SendGrid's development environment."""

from __future__ import annotations

import base64
import secrets

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from notiflow.adapters.providers.base import DevEndpoints
from notiflow.adapters.providers.devkeys import private_pem


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """A random ``SG.`` API key and an ECDSA P-256 Event Webhook key pair (the emulator signs
    events with the private key, the API checks them with the public one); the Event Webhook
    posts to the API's ``/webhooks/sendgrid``."""
    webhook_key = ec.generate_private_key(ec.SECP256R1())
    webhook_public = webhook_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return {
        "NOTIFLOW_SENDGRID__BASE_URL": f"{endpoints.fakes_url}/sendgrid",
        "NOTIFLOW_SENDGRID__API_KEY": (f"SG.{secrets.token_urlsafe(16)}."
                                       f"{secrets.token_urlsafe(32)}"),
        "NOTIFLOW_SENDGRID__EVENT_WEBHOOK_URL": f"{endpoints.webhook_url}/webhooks/sendgrid",
        "NOTIFLOW_SENDGRID__EVENT_WEBHOOK_PUBLIC_KEY": base64.b64encode(webhook_public).decode(),
        "NOTIFLOW_SENDGRID__EVENT_WEBHOOK_SIGNING_KEY": private_pem(webhook_key),
    }
