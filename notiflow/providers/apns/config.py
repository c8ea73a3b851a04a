"""The APNs plug-in's settings section (``NOTIFLOW_APNS__...``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import SecretStr

from notiflow.schemas.enums import Channel, PushPlatform
from notiflow.settings.plugin import ProviderPlugin, SectionSpec, configured, url_fields
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen


class ApnsSettings(_Frozen):
    """Apple Push Notification service with a token-based (ES256 JWT) provider key;
    ``base_url`` points at ``https://api.push.apple.com`` or at ``notiflow fakes``."""

    provider_id: str = "apns"
    base_url: str = "https://127.0.0.1:18443"
    team_id: str | None = None
    key_id: str | None = None
    private_key: SecretStr | None = None
    """The .p8 signing key (PEM, EC P-256)."""
    topic: str = "com.example.notiflow"
    """The app's bundle id (``apns-topic``)."""
    ca_file: str | None = None
    """Extra CA certificate to trust (the emulator's test CA); None = system trust."""


class ApnsPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "apns", ApnsSettings, configured("team_id", "key_id", "private_key"),
        ProviderRoute(provider_id="apns", channel=Channel.PUSH, reliability=0.995,
                      platforms=frozenset({PushPlatform.IOS})),
        endpoints=url_fields("base_url"))
    apns: ApnsSettings = ApnsSettings()
