"""Teams' development environment."""

from __future__ import annotations

from notiflow.adapters.providers.base import DevEndpoints


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """Webhook URLs are accepted under the emulator's Workflows and Office 365 connector
    paths."""
    fakes = endpoints.fakes_url
    return {"NOTIFLOW_TEAMS__WEBHOOK_PREFIXES": (f'["{fakes}/teams/workflows/", '
                                                 f'"{fakes}/teams/webhookb2/"]')}
