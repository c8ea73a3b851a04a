"""The SendGrid plug-in's settings section (``NOTIFLOW_SENDGRID__...``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, SecretStr

from notiflow.schemas.enums import Channel
from notiflow.settings.plugin import ProviderPlugin, SectionSpec, configured, url_fields
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen


class SendGridSettings(_Frozen):
    """SendGrid v3 Mail Send account; the base URL points at SendGrid
    (``https://api.sendgrid.com``) or at ``notiflow fakes``."""

    provider_id: str = "sendgrid"
    base_url: str = "http://127.0.0.1:18090/sendgrid"
    api_key: SecretStr | None = None
    from_email: str = "notifications@example.com"
    """A verified Sender Identity of the account."""
    from_name: str | None = "notiflow"
    event_webhook_url: str | None = None
    """Where the account's Event Webhook posts (set in the SendGrid account, not per message);
    the emulator posts there when its ``callbacks_enabled`` knob is on."""
    event_webhook_public_key: str | None = None
    """Verification key of the signed Event Webhook: base64 DER (SubjectPublicKeyInfo) of an
    ECDSA P-256 key, as SendGrid shows it."""
    event_webhook_signing_key: SecretStr | None = None
    """Emulator only: the PEM private key ``notiflow fakes`` signs events with (SendGrid keeps
    its own); never set in production."""
    max_personalizations: int = Field(1000, ge=1, le=1000)
    """Most recipients one Mail Send request carries when a tier batches its email
    (``provider_batch``); SendGrid's own limit is 1,000."""


class SendGridPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "sendgrid", SendGridSettings, configured("api_key"),
        ProviderRoute(provider_id="sendgrid", channel=Channel.EMAIL, cost=1.0,
                      reliability=0.995),
        endpoints=url_fields("base_url"))
    sendgrid: SendGridSettings = SendGridSettings()
