"""Credentials that change while a process runs: the settings in force, and the ones they
replaced, still valid for verification during a rotation window.

A process holds one :class:`Keyring`. When the secrets directory changes
(``adapters/secret_watch.py``) it is given freshly loaded settings; of what differs, only the
sections in :data:`RELOADABLE` (tenants, provider accounts) take effect; any other difference
waits for a restart and is reported as such. The settings replaced are kept for
``secrets_rotation_window``: a bearer token or a webhook signature made with a retired secret
is still accepted until then (:meth:`Keyring.tenant_by_token`, :meth:`Keyring.sections`),
while everything this process signs or sends uses the new one at once. Nothing here reads a
file or a store; the clock is injected."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from notiflow.settings import Settings, TenantConfig

RELOADABLE: Final = ("tenants", *(name for name, spec in Settings.section_specs().items()
                                  if spec.reloadable))
"""Settings fields a running process takes from a reload: each tenant's token, policy and
webhook secrets, and the credentials and parameters of each provider account whose plug-in
says so (``SectionSpec.reloadable``)."""


@dataclass(frozen=True, slots=True)
class Reload:
    """What a reload changed: ``applied`` took effect; ``pending`` differs but waits for a
    restart (infrastructure, tier policies, the dead-letter key...)."""

    applied: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()


def differing(before: Settings, after: Settings) -> list[str]:
    """The settings fields whose values differ (secrets compared by value)."""
    return sorted(name for name in type(before).model_fields
                  if getattr(before, name) != getattr(after, name))


class Keyring:
    """The settings in force and the retired ones still valid for verification."""

    def __init__(self, settings: Settings, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._current = settings
        self._retired: list[tuple[float, Settings]] = []
        self.clock = clock

    @property
    def settings(self) -> Settings:
        return self._current

    def reload(self, fresh: Settings) -> Reload:
        """Take the :data:`RELOADABLE` sections of ``fresh`` that differ; the settings they
        replace stay valid for verification for the current ``secrets_rotation_window``."""
        changed = differing(self._current, fresh)
        applied = tuple(n for n in changed if n in RELOADABLE)
        if applied:
            until = self.clock() + self._current.secrets_rotation_window.total_seconds()
            self._retired.insert(0, (until, self._current))
            self._current = self._current.model_copy(
                update={n: getattr(fresh, n) for n in applied})
        return Reload(applied, tuple(n for n in changed if n not in RELOADABLE))

    def in_force(self) -> list[Settings]:
        """The current settings, then the retired ones whose window is still open (newest
        first); expired ones are forgotten."""
        now = self.clock()
        self._retired = [(until, s) for until, s in self._retired if until > now]
        return [self._current, *(s for _, s in self._retired)]

    def sections(self, name: str) -> list[Any]:
        """Settings section ``name`` (``twilio``, ``smtp``...) as currently configured, then
        as configured before, while their window is open; each distinct value once. A
        webhook signed with any of them is the provider's."""
        out: list[Any] = []
        for settings in self.in_force():
            section = getattr(settings, name)
            if section not in out:
                out.append(section)
        return out

    def tenant_by_token(self, token: str) -> TenantConfig | None:
        """The tenant whose current token this is, or whose token it was before a rotation
        whose window is open; either way the tenant as configured now (None when it is no
        longer configured)."""
        current = self._current.tenant_by_token(token)
        if current is not None:
            return current
        for settings in self.in_force()[1:]:
            retired = settings.tenant_by_token(token)
            if retired is not None:
                return self._current.tenant(retired.id)
        return None
