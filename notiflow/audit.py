"""The audit trail's vocabulary and the fingerprints of audited configuration.

Audited (``docs/operations.md``, "Audit"): template versions created through the API, a
tenant's policy as configured (tiers, channels, templates, limits, webhook secrets), each
provider's credentials, the ingest encryption keys and the dead-letter key (by fingerprint:
a truncated SHA-256 of the secret, never the secret), P0 acceptances per tenant (counted per
minute and API process), and the dead-letter actions (``dlq_audit``: reveal, replay, purge).
Nothing here reads a clock or a store."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, SecretStr

from notiflow.settings import Settings, TenantConfig


class Action(StrEnum):
    TEMPLATE_CREATE = "template.create"
    TENANT_POLICY = "tenant.policy"
    CREDENTIALS = "credentials.rotated"
    P0_USE = "p0.use"
    USER_ERASE = "user.erase"


@dataclass(frozen=True)
class AuditEvent:
    at: datetime
    action: str
    actor: str
    tenant_id: str | None
    subject: str
    detail: dict[str, Any] = field(default_factory=dict)


def fingerprint(secret: SecretStr | str | None) -> str | None:
    """``sha256:`` and the first 12 hex digits of the secret's SHA-256 (enough to tell two
    secrets apart in an audit, far too little to guess one); None when unset."""
    if secret is None:
        return None
    value = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    if not value:
        return None
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:12]


def tenant_policy(tenant: TenantConfig) -> dict[str, Any]:
    """What a tenant may do, as audited: its limits and allowances, its secrets by
    fingerprint."""
    return {
        "tiers": sorted(t.value for t in tenant.tiers),
        "channels": sorted(c.value for c in tenant.channels),
        "templates": None if tenant.templates is None else sorted(tenant.templates),
        "rate_limit": tenant.rate_limit,
        "daily_marketing_cap": tenant.daily_marketing_cap,
        "timezone": tenant.timezone,
        "max_active_campaigns": tenant.max_active_campaigns,
        "max_campaign_recipients": tenant.max_campaign_recipients,
        "token": fingerprint(tenant.token),
        "webhook_secrets": [fingerprint(s) for s in tenant.webhook_secrets],
    }


def _secrets(model: BaseModel) -> dict[str, str | None]:
    return {name: fingerprint(value) for name, value in model if isinstance(value, SecretStr)}


def credentials(settings: Settings) -> dict[str, dict[str, str | None]]:
    """Every provider account's secrets, the ingest encryption keys and the dead-letter key,
    by fingerprint."""
    providers = {name: _secrets(getattr(settings, name))
                 for name in ("twilio", "vonage", "sendgrid", "ses", "fcm", "apns", "smtp")}
    providers["ingest"] = _secrets(settings.ingest_encryption)
    return {**{k: v for k, v in providers.items() if any(v.values())},
            "dlq": {"key": fingerprint(settings.dlq_key)}}


def digest(detail: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(detail, sort_keys=True, default=str).encode()
                          ).hexdigest()


def configuration(settings: Settings) -> dict[str, tuple[Action, str | None, dict[str, Any]]]:
    """subject → (action, tenant, detail) of every audited piece of configuration."""
    out: dict[str, tuple[Action, str | None, dict[str, Any]]] = {
        f"tenant:{t.id}": (Action.TENANT_POLICY, t.id, tenant_policy(t))
        for t in settings.tenants}
    for name, secrets in credentials(settings).items():
        out[f"credentials:{name}"] = (Action.CREDENTIALS, None, secrets)
    return out


def changed_fields(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """The keys whose values differ (every key when there was no before)."""
    if before is None:
        return sorted(after)
    return sorted(k for k in {*before, *after} if before.get(k) != after.get(k))
