"""The sample plug-in's settings section and registry entry."""

from __future__ import annotations

from typing import ClassVar

from pydantic import SecretStr

from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from notiflow.settings.plugin import ProviderPlugin, SectionSpec, configured, url_fields
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen


class SampleSettings(_Frozen):
    provider_id: str = "sample"
    base_url: str = "http://127.0.0.1:18090/sample"
    token: SecretStr | None = None


class SamplePlugin(ProviderPlugin):
    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "sample", SampleSettings, configured("token"),
        ProviderRoute(provider_id="sample", channel=Channel.SMS, cost=0.5),
        endpoints=url_fields("base_url"))
    sample: SampleSettings = SampleSettings()


class SettingsWithSample(Settings, SamplePlugin):
    """The settings object of a registry with the sample plug-in added (its one line)."""
