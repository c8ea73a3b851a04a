"""The provider plug-ins' framework: the adapter interface (``base``), the shared tables and
HTTP plumbing (``common``, ``sms``, ``webhook``, ``chat``, ``batching``, ``swappable``), and
opening a provider account by provider id.

The plug-ins themselves are the packages of :mod:`notiflow.providers`, listed by
:mod:`notiflow.providers.registry`. :func:`provider_specs` finds each plug-in's
:class:`~notiflow.adapters.providers.base.ProviderSpec` (its package's ``SPEC``) from the
plug-ins of a settings class (``provider_specs(Settings)``: the registry's).
:func:`open_provider`
opens the client of one configured provider account: the id is matched against
``settings.<spec.name>.provider_id``. Adapter modules are imported on first use, so
importing this package stays cheap.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable, Mapping
from datetime import timedelta

from pydantic import BaseModel

from notiflow.adapters.providers.base import ProviderClient, ProviderSpec
from notiflow.settings import Settings
from notiflow.settings.plugin import plugins


@functools.cache
def provider_specs(settings_type: type[BaseModel]) -> Mapping[str, ProviderSpec]:
    """Section name → ``SPEC`` of each plug-in of ``settings_type``, in registry order: the
    ``spec`` module next to the plug-in's ``config`` module holds it."""
    specs: dict[str, ProviderSpec] = {}
    for plugin in plugins(settings_type):
        module = plugin.__module__.rpartition(".")[0] + ".spec"
        spec = importlib.import_module(module).SPEC
        if not isinstance(spec, ProviderSpec) or spec.name != plugin.SECTION.name:
            raise TypeError(f"{module}.SPEC is not the ProviderSpec of {plugin.SECTION.name!r}")
        specs[spec.name] = spec
    return specs


def provider_kinds(settings: Settings) -> dict[str, str]:
    """Configured provider id → settings section (``{"twilio": "twilio", ...}``); raises
    ``ValueError`` when two sections share a provider id."""
    kinds: dict[str, str] = {}
    for kind, section in settings.provider_sections().items():
        provider_id = section.provider_id
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
    return await provider_specs(type(settings))[kind].open(settings, timeout)


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
