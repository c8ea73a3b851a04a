"""The SMTP plug-in's settings section (``NOTIFLOW_SMTP__...``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from notiflow.schemas.enums import Channel
from notiflow.settings.plugin import ProviderPlugin, SectionSpec
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen, present


class SmtpSettings(_Frozen):
    """An SMTP relay (second email route); ``notiflow fakes`` serves one on ``port``."""

    provider_id: str = "smtp"
    host: str = "127.0.0.1"
    port: int = 18025
    username: str | None = None
    password: SecretStr | None = None
    starttls: bool = False
    from_email: str = "notifications@example.com"
    max_connections: int = Field(50, ge=1, le=1000)
    """Concurrent SMTP connections per send process (one transaction at a time each; 50 is
    Postfix's default per-client limit). A send waiting longer than half its timeout for one
    fails as ``pool_exhausted`` (transient, counted by the breaker), so this should cover the
    email sends a tier keeps in flight (``max_in_flight``): with 4, and with 16, the
    benchmark's campaign flood queued sends behind a slow relay until they failed."""
    dsn_webhook_secret: SecretStr | None = None
    """Bearer token the relay's bounce pipe sends to ``POST /webhooks/smtp-dsn``; unset, every
    DSN post is refused."""
    dsn_webhook_url: str | None = None
    """Where the relay's bounce pipe posts DSNs (configured in the MTA, not here); the
    emulator posts its DSNs there."""


def enabled(section: SmtpSettings) -> bool:
    """The relay's login is configured."""
    return section.username is not None and present(section.password)


class SmtpPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "smtp", SmtpSettings, enabled,
        ProviderRoute(provider_id="smtp", channel=Channel.EMAIL, cost=0.4, reliability=0.98))
    smtp: SmtpSettings = SmtpSettings()
