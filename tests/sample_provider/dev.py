"""The sample plug-in's development environment."""

from __future__ import annotations

import secrets

from notiflow.adapters.providers.base import DevEndpoints


def environment(endpoints: DevEndpoints) -> dict[str, str]:
    """A random token and the emulator's URL."""
    return {"NOTIFLOW_SAMPLE__BASE_URL": f"{endpoints.fakes_url}/sample",
            "NOTIFLOW_SAMPLE__TOKEN": secrets.token_urlsafe(16)}
