"""The SMTP relay's DSN webhook authentication: ``Authorization: Bearer
<smtp.dsn_webhook_secret>`` (pure)."""

from __future__ import annotations

import hmac

from pydantic import SecretStr

from notiflow.adapters.providers.webhook import WebhookRefused


def check_bearer(secret: SecretStr | None, header: str | None) -> None:
    """Raise :class:`WebhookRefused` unless ``header`` is ``Bearer <secret>`` (constant-time
    compare)."""
    if secret is None:
        raise WebhookRefused("webhook_not_configured", "no DSN webhook secret is configured")
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), secret.get_secret_value().encode()):
        raise WebhookRefused("invalid_token",
                             "Authorization: Bearer <DSN webhook secret> required")
