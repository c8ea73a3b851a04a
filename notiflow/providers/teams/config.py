"""The Microsoft Teams plug-in's settings section (``NOTIFLOW_TEAMS__...``)."""

from __future__ import annotations

from typing import ClassVar

from notiflow.settings.plugin import ProviderPlugin, SectionSpec, chat_section
from notiflow.settings.providers import ChatSettings, PaceRule, WebhookPrefixes


class TeamsSettings(ChatSettings):
    """Microsoft Teams incoming webhooks: Workflows (Power Automate) webhooks answer ``202``
    and the retired Office 365 connectors ``200`` ``1``; the recipient is the URL."""

    provider_id: str = "teams"
    webhook_prefixes: WebhookPrefixes = (
        "https://*.webhook.office.com/webhookb2/",
        "https://*.logic.azure.com/workflows/",
        "https://*.environment.api.powerplatform.com/powerautomate/automations/direct/",
    )
    pace: PaceRule = PaceRule(rate=2.0, burst=4)
    """Teams connectors take 4 posts in a second and 60 in 30 seconds per webhook; its longer
    windows (100 an hour) answer ``429``, which the message then waits out."""


class TeamsPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = chat_section("teams", TeamsSettings, reliability=0.99)
    teams: TeamsSettings = TeamsSettings()
