"""Slack's development environment."""

from __future__ import annotations

from notiflow.adapters.providers.base import DevEndpoints


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """Webhook URLs are accepted under the emulator's ``/slack/services/``."""
    return {"NOTIFLOW_SLACK__WEBHOOK_PREFIXES": f'["{endpoints.fakes_url}/slack/services/"]'}
