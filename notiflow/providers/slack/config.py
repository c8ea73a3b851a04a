"""The Slack plug-in's settings section (``NOTIFLOW_SLACK__...``)."""

from __future__ import annotations

from typing import ClassVar

from notiflow.settings.plugin import ProviderPlugin, SectionSpec, chat_section
from notiflow.settings.providers import ChatSettings, PaceRule, WebhookPrefixes


class SlackSettings(ChatSettings):
    """Slack incoming webhooks: a message's recipient is the webhook URL (which is the
    credential), so the provider has no account secret; it serves the URLs under
    ``webhook_prefixes`` and nothing else."""

    provider_id: str = "slack"
    webhook_prefixes: WebhookPrefixes = ("https://hooks.slack.com/services/",)
    pace: PaceRule = PaceRule(rate=1.0, burst=1)
    """Slack allows one post per second per webhook, with short bursts it does not promise."""


class SlackPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = chat_section("slack", SlackSettings, reliability=0.995)
    slack: SlackSettings = SlackSettings()
