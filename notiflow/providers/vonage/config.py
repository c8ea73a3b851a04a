"""The Vonage plug-in's settings section (``NOTIFLOW_VONAGE__...``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import SecretStr

from notiflow.schemas.enums import Channel
from notiflow.settings.plugin import ProviderPlugin, SectionSpec, configured, url_fields
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen


class VonageSettings(_Frozen):
    """Vonage SMS API account (second SMS vendor); ``base_url`` points at
    ``https://rest.nexmo.com`` or at ``notiflow fakes``."""

    provider_id: str = "vonage"
    base_url: str = "http://127.0.0.1:18090/vonage"
    api_key: str | None = None
    api_secret: SecretStr | None = None
    signature_secret: SecretStr | None = None
    """Shared secret of signed requests / delivery receipts (Vonage "signature secret")."""
    from_name: str = "Notiflow"
    status_callback_url: str | None = None
    """Delivery-receipt webhook (``callback`` per message, or the account default)."""


class VonagePlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "vonage", VonageSettings, configured("api_key", "api_secret"),
        ProviderRoute(provider_id="vonage", channel=Channel.SMS, cost=0.8, reliability=0.99),
        endpoints=url_fields("base_url"))
    vonage: VonageSettings = VonageSettings()
