"""Provider adapters, one package per provider, and the registry that opens them by provider id.

Each provider package (``twilio``, ``vonage``, ...) exposes one ``SPEC``
(:class:`~notiflow.adapters.providers.base.ProviderSpec`); :data:`PROVIDERS` lists them, one
entry per provider. :func:`open_provider` opens the client of one configured provider account:
the id is matched against ``settings.<spec.name>.provider_id``. Adapter modules are imported on
first use, so importing this package stays cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Final

from notiflow.adapters.providers import (
    apns,
    fcm,
    inbox,
    sendgrid,
    ses,
    slack,
    smtp,
    teams,
    twilio,
    vonage,
)
from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.settings import Settings

PROVIDERS: Final[Mapping[str, ProviderSpec]] = {spec.name: spec for spec in (
    twilio.SPEC, vonage.SPEC, sendgrid.SPEC, ses.SPEC, smtp.SPEC, fcm.SPEC, apns.SPEC,
    slack.SPEC, teams.SPEC, inbox.SPEC)}
"""Settings section (= provider package) → its spec."""


def provider_kinds(settings: Settings) -> dict[str, str]:
    """Configured provider id → settings section (``{"twilio": "twilio", ...}``); raises
    ``ValueError`` when two sections share a provider id."""
    kinds: dict[str, str] = {}
    for kind in PROVIDERS:
        provider_id = getattr(settings, kind).provider_id
        if provider_id in kinds:
            raise ValueError(f"provider id {provider_id!r} is configured for both "
                             f"{kinds[provider_id]} and {kind}")
        kinds[provider_id] = kind
    return kinds


async def open_provider(settings: Settings, provider_id: str, *,
                        timeout: float | timedelta) -> ProviderClient:
    """Open the client of provider account ``provider_id`` inside the running loop.

    ``timeout`` bounds each ``send`` of the client (the tier's ``provider_timeout``). Raises
    ``ValueError`` for an unknown provider id, for duplicate provider ids, and (from the
    adapter) when the account's credentials are not configured. The caller owns the client
    and must ``aclose()`` it.
    """
    kind = provider_kinds(settings).get(provider_id)
    if kind is None:
        raise ValueError(f"unknown provider id {provider_id!r}")
    return await PROVIDERS[kind].open(settings, timeout)


async def open_providers(settings: Settings, provider_ids: Iterable[str], *,
                         timeout: float | timedelta) -> dict[str, ProviderClient]:
    """Open several provider accounts (provider id → client); if one fails, those already
    open are closed and the error is raised."""
    clients: dict[str, ProviderClient] = {}
    try:
        for provider_id in provider_ids:
            if provider_id not in clients:
                clients[provider_id] = await open_provider(settings, provider_id,
                                                           timeout=timeout)
    except BaseException:
        for client in clients.values():
            await client.aclose()
        raise
    return clients
