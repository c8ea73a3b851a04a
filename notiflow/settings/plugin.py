"""What a provider plug-in gives the settings object: its section as a field, and a
:class:`SectionSpec` saying how to read it.

A plug-in's ``config`` module defines its section and a :class:`ProviderPlugin` subclass with
one field, named like the section, and its ``SECTION``; the registry
(:mod:`notiflow.providers.registry`) lists those classes as bases of ``ProviderSections``,
which :class:`~notiflow.settings.Settings` derives from, so the section is read from
``NOTIFLOW_<NAME>__...``. Everything that enumerates providers asks :func:`plugins`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, SecretStr

from notiflow.schemas.enums import Channel
from notiflow.settings.providers import ChatSettings, ProviderRoute, chat_enabled, chat_endpoints
from notiflow.settings.section import present


class ProviderSection(Protocol):
    """What every provider's settings section has."""

    @property
    def provider_id(self) -> str:
        """The account's provider id (the router's, the breakers', the receipts')."""
        ...


def _no_endpoints(_section: Any) -> Iterable[tuple[str, str]]:
    return ()


def _is_set(value: object) -> bool:
    return present(value) if isinstance(value, SecretStr) else bool(value)


def configured(*names: str) -> Callable[[Any], bool]:
    """The ``enabled`` of a section whose account is on once every field ``names`` is set: a
    secret present and not empty, any other value truthy."""
    def enabled(section: Any) -> bool:
        return all(_is_set(getattr(section, name)) for name in names)

    return enabled


def url_fields(*names: str) -> Callable[[Any], Iterable[tuple[str, str]]]:
    """The ``endpoints`` of a section whose endpoints are its URL fields ``names``."""
    def endpoints(section: Any) -> Iterable[tuple[str, str]]:
        return [(name, getattr(section, name)) for name in names]

    return endpoints


@dataclass(frozen=True, slots=True)
class SectionSpec:
    """How the settings object reads one provider plug-in's section."""

    name: str
    """The section's field (``settings.<name>``, ``NOTIFLOW_<NAME>__...``), the plug-in's
    package name and its default provider id."""
    section: type[BaseModel]
    """The section's model; it has a ``provider_id`` field."""
    enabled: Callable[[Any], bool]
    """Section → whether the account's credentials are configured (a router candidate)."""
    route: ProviderRoute
    """The account's default entry of ``settings.routes``."""
    endpoints: Callable[[Any], Iterable[tuple[str, str]]] = _no_endpoints
    """Section → (field, URL) of every endpoint it sends credentials or messages to; outside
    development each must be ``https`` or loopback."""
    reloadable: bool = True
    """A running process takes a changed section from a secrets reload
    (``notiflow/secrets.py``); off: a change waits for a restart."""


def chat_section(name: str, section: type[ChatSettings], *, reliability: float) -> SectionSpec:
    """The spec of the incoming-webhook chat section ``name``: on by :func:`chat_enabled`, its
    endpoints its webhook prefixes, a CHAT route of ``reliability`` under the provider id
    ``name``, and a change waits for a restart."""
    return SectionSpec(
        name, section, chat_enabled,
        ProviderRoute(provider_id=name, channel=Channel.CHAT, reliability=reliability),
        endpoints=chat_endpoints, reloadable=False)


class ProviderPlugin(BaseModel):
    """Base of a plug-in's settings field: a model with one field, named ``SECTION.name``,
    holding the section."""

    SECTION: ClassVar[SectionSpec]


@functools.cache
def plugins(settings_type: type[BaseModel]) -> tuple[type[ProviderPlugin], ...]:
    """Every plug-in among the bases of ``settings_type``, in method resolution order (the
    registry's order)."""
    return tuple(base for base in settings_type.__mro__
                 if issubclass(base, ProviderPlugin) and "SECTION" in base.__dict__)


@functools.cache
def section_specs(settings_type: type[BaseModel]) -> Mapping[str, SectionSpec]:
    """Section name → spec of every plug-in of ``settings_type``, in registry order."""
    return MappingProxyType({p.SECTION.name: p.SECTION for p in plugins(settings_type)})


@functools.cache
def sections_of(settings_type: type[BaseModel], kind: type[BaseModel]) -> tuple[str, ...]:
    """The names of the plug-in sections of ``settings_type`` that are ``kind`` models."""
    return tuple(name for name, spec in section_specs(settings_type).items()
                 if issubclass(spec.section, kind))
