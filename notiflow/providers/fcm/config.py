"""The FCM plug-in's settings section (``NOTIFLOW_FCM__...``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import SecretStr

from notiflow.schemas.enums import Channel, PushPlatform
from notiflow.settings.plugin import ProviderPlugin, SectionSpec, configured, url_fields
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen


class FcmSettings(_Frozen):
    """Firebase Cloud Messaging HTTP v1 with a service account; ``base_url`` points at
    ``https://fcm.googleapis.com`` and ``token_uri`` at ``https://oauth2.googleapis.com/token``,
    or both at ``notiflow fakes``."""

    provider_id: str = "fcm"
    base_url: str = "http://127.0.0.1:18090/fcm"
    project_id: str = "notiflow-dev"
    client_email: str | None = None
    """The service account's ``client_email``."""
    private_key: SecretStr | None = None
    """The service account's RSA ``private_key`` (PEM)."""
    private_key_id: str | None = None
    token_uri: str = "http://127.0.0.1:18090/fcm/token"


class FcmPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "fcm", FcmSettings, configured("client_email", "private_key"),
        ProviderRoute(provider_id="fcm", channel=Channel.PUSH, reliability=0.995,
                      platforms=frozenset({PushPlatform.ANDROID, PushPlatform.WEB})),
        endpoints=url_fields("base_url", "token_uri"))
    fcm: FcmSettings = FcmSettings()
