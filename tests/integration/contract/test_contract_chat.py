"""Slack and Teams incoming webhooks (chat): their harnesses. The recipient is the webhook URL and
there is no account secret; neither has a case of its own, so their whole contract is the
generic one in ``test_contract_common.py``, run for both."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from notiflow.adapters.providers.base import Outcome
from notiflow.providers.slack.client import SlackWebhook
from notiflow.providers.teams.client import TeamsWebhook
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from tests.integration.contract.harness import (
    Harness,
    Overrides,
    Recipient,
    Rejection,
)

pytestmark = pytest.mark.integration


# Slack and Teams (chat webhooks: the recipient is the URL, there is no account secret) ----------


class WebhookUrls(Mapping[str, str]):
    """Scenario → webhook URL at the emulator under this session's ``{section}``'s first
    prefix (read when a test asks: the fakes' port is the session's)."""

    def __init__(self, section: str, paths: Mapping[str, str]) -> None:
        self.section, self.paths = section, paths

    prefixes: dict[str, str] = {}

    def __getitem__(self, scenario: str) -> str:
        if self.section not in self.prefixes:
            self.prefixes[self.section] = getattr(Settings(), self.section).webhook_prefixes[0]
        return self.prefixes[self.section] + self.paths[scenario]

    def __iter__(self) -> Any:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


def chat_configure(section: str, path: str) -> Callable[[Settings, Overrides], Settings]:
    """``base_url`` moves the section's prefix to another origin; nothing else applies."""

    def configure(settings: Settings, overrides: Overrides) -> Settings:
        if "base_url" not in overrides:
            return settings
        config = getattr(settings, section).model_copy(
            update={"webhook_prefixes": (f"{overrides['base_url']}{path}",)})
        return settings.model_copy(update={section: config})

    return configure


def rebase(recipient: Recipient, base: str) -> Recipient:
    """``recipient`` (a webhook URL) at another origin, same path."""
    assert isinstance(recipient, str)
    return base + urlsplit(recipient).path


async def _no_credentials(settings: Settings) -> httpx.Response:
    raise AssertionError("a chat webhook has no account credentials")


CHAT_COMMON: dict[str, Any] = dict(
    channel=Channel.CHAT, unauthorized=_no_credentials, unauthorized_body={},
    wrong_secret=lambda: "", auth_rule=(Outcome.PERMANENT, "invalid_recipient"),
    unauthorized_records=(), credentials=False, rebase=rebase)

SLACK = Harness(
    name="slack",
    recipients=WebhookUrls("slack", {
        "ok": "T0001/B0001/okToken", "revoked": "T0001/B0002/revokedToken",
        "gone": "T0001/B0003/goneToken", "archived": "T0001/B0004/archivedToken",
        "prohibited": "T0001/B0005/prohibitedToken"}),
    rejections=(Rejection("revoked", "invalid_recipient", deactivate=True),
                Rejection("gone", "invalid_recipient", deactivate=True),
                Rejection("archived", "invalid_recipient", deactivate=True),
                Rejection("prohibited", "forbidden")),
    configure=chat_configure("slack", "/slack/services/"), adapter=SlackWebhook,
    provider_message_id=re.compile(r"[0-9a-f]{32}:[0-9]+"), **CHAT_COMMON)

TEAMS = Harness(
    name="teams",
    recipients=WebhookUrls("teams", {
        "ok": "a1b2/triggers/manual/paths/invoke?api-version=1&sig=okSig",
        "gone": "a1b2/triggers/manual/paths/goneFlow",
        "unauthorized": "a1b2/triggers/manual/paths/unauthorizedFlow"}),
    rejections=(Rejection("gone", "invalid_recipient", deactivate=True),
                Rejection("unauthorized", "invalid_recipient", deactivate=True)),
    configure=chat_configure("teams", "/teams/workflows/"), adapter=TeamsWebhook,
    provider_message_id=re.compile(r"[0-9a-f]{32}:[0-9]+"), **CHAT_COMMON)
