"""Cassandra's side of the send step in memory: :class:`MemoryMessages` (templates, message
heads, attempts) and :class:`MemoryPreferences` (recipient states, with the suppressions
and token deactivations the send step writes). Dict-backed, guarded by a lock."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from notiflow.adapters.memory.clock import Clock
from notiflow.adapters.rows import AttemptRow, LocaleVariant, MessageRow, TemplateRow
from notiflow.schemas.enums import Status
from notiflow.schemas.preferences import PreferenceState, Suppression, state_key
from notiflow.schemas.status import rank
from notiflow.templating import analyse, version_checksum


class MemoryMessages:
    """The :class:`~notiflow.adapters.ports.Messages` port over dicts a test fills."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.templates: dict[tuple[str, str, int], TemplateRow] = {}
        self.heads: dict[str, MessageRow] = {}
        self.attempt_rows: dict[str, list[AttemptRow]] = {}
        self._lock = threading.Lock()

    def put_template(self, tenant_id: str, template_id: str, channel: str, body: str,
                     subject: str | None = None, version: int = 1,
                     locales: Mapping[str, tuple[str | None, str]] | None = None) -> int:
        """Store a template row as the API writes it (``locales``: tag → subject and body
        of each variant); returns its version."""
        info = analyse(subject, body)
        variants = {tag: LocaleVariant(vs, vb, analyse(vs, vb).checksum)
                    for tag, (vs, vb) in (locales or {}).items()}
        with self._lock:
            self.templates[(tenant_id, template_id, version)] = TemplateRow(
                tenant_id=tenant_id, template_id=template_id, version=version,
                channel=channel, subject=subject, body=body, variables=info.variables,
                checksum=version_checksum(info.checksum,
                                          {t: v.checksum for t, v in variants.items()}),
                created_at=self.clock(), locales=variants)
        return version

    def set_status(self, message_id: str, status: Status, attempt: int = 0,
                   **row: Any) -> None:
        """Make ``status`` of ``attempt`` the message row's current status (``row``: other
        columns of :class:`MessageRow` to set)."""
        with self._lock:
            head = self.heads.get(message_id) or MessageRow(message_id)
            self.heads[message_id] = dataclasses.replace(
                head, **row, status=status.value, attempt=attempt,
                status_rank=rank(status, attempt))

    def add_attempt(self, row: AttemptRow) -> None:
        with self._lock:
            self.attempt_rows.setdefault(row.message_id, []).append(row)

    async def message(self, message_id: str) -> MessageRow | None:
        with self._lock:
            return self.heads.get(message_id)

    async def get_template(self, tenant_id: str, template_id: str,
                           version: int) -> TemplateRow | None:
        with self._lock:
            return self.templates.get((tenant_id, template_id, version))

    async def attempts(self, message_id: str) -> list[AttemptRow]:
        with self._lock:
            return list(self.attempt_rows.get(message_id, ()))


class MemoryPreferences:
    """The :class:`~notiflow.adapters.ports.Preferences` and
    :class:`~notiflow.adapters.ports.SmsConsent` ports over a dict of states by
    ``state_key``; each write makes a new version (as ``PreferenceStore`` does)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.states: dict[str, PreferenceState] = {}
        self.deactivated: list[tuple[str, str, str]] = []
        """(tenant, token hash, reason) of every registered-device row marked inactive."""
        self._lock = threading.Lock()

    def put(self, state: PreferenceState) -> None:
        with self._lock:
            self.states[state.key] = state

    def get(self, tenant_id: str, recipient_hash: str) -> PreferenceState | None:
        with self._lock:
            return self.states.get(state_key(tenant_id, recipient_hash))

    async def get_states(self, keys: Iterable[tuple[str, str]]
                         ) -> Mapping[str, PreferenceState]:
        with self._lock:
            found = (self.states.get(state_key(*k)) for k in keys)
            return {st.key: st for st in found if st is not None}

    def _write(self, tenant_id: str, recipient_hash: str, **change: Any) -> PreferenceState:
        key = state_key(tenant_id, recipient_hash)
        now: datetime = self.clock()
        old = self.states.get(key)
        state = (PreferenceState(tenant_id=tenant_id, recipient_hash=recipient_hash,
                                 version=1, updated_at=now, **change) if old is None
                 else old.model_copy(update={**change, "version": old.version + 1,
                                             "updated_at": now}))
        self.states[key] = state
        return state

    async def suppress(self, tenant_id: str, recipient_hash: str,
                       reason: Suppression) -> PreferenceState:
        with self._lock:
            return self._write(tenant_id, recipient_hash, suppressed=reason)

    async def unsuppress(self, tenant_id: str, recipient_hash: str, *,
                         only: Suppression | None = None) -> PreferenceState | None:
        with self._lock:
            old = self.states.get(state_key(tenant_id, recipient_hash))
            if old is None or old.suppressed is None or only not in (None, old.suppressed):
                return old
            return self._write(tenant_id, recipient_hash, suppressed=None)

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str, *,
                               older: Sequence[str] = ()) -> PreferenceState:
        with self._lock:
            state = self._write(tenant_id, token_hash, suppressed="token_deactivated")
            for h in dict.fromkeys((token_hash, *older)):
                self.deactivated.append((tenant_id, h, reason))
            return state
