"""Recipient redaction for logs, traces, status rows and DLQ listings."""

from __future__ import annotations

import hashlib


def recipient_hash(tenant_id: str, recipient_key: str) -> str:
    """Stable pseudonymous id of a recipient within a tenant (not reversible by lookup table
    across tenants; still treat it as personal data)."""
    return hashlib.sha256(f"{tenant_id}\x1f{recipient_key}".encode()).hexdigest()[:32]


def mask(recipient_key: str) -> str:
    """Human-readable but redacted form: ``+4179*****67``, ``j***@example.com``, ``ios:ab12…9f``,
    ``https://hooks.slack.com/…`` (a webhook URL is a credential: only its origin shows)."""
    if "://" in recipient_key:
        scheme, _, rest = recipient_key.partition("://")
        host = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
        return f"{scheme}://{host}/…"
    if "@" in recipient_key:
        local, _, domain = recipient_key.partition("@")
        return f"{local[:1]}***@{domain}"
    if recipient_key.startswith("+"):
        keep = recipient_key[:5]
        return f"{keep}{'*' * max(len(recipient_key) - 7, 1)}{recipient_key[-2:]}"
    platform, _, token = recipient_key.rpartition(":")
    prefix = f"{platform}:" if platform else ""
    return f"{prefix}{token[:4]}…{token[-2:]}"
