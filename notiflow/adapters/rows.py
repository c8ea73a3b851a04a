"""The rows of a message and of its template as the stores return them and the ports
declare them: frozen, slotted values that name no driver.

Each mirrors its Cassandra table (``schemas/cql``): columns keep their stored types (a
status is its ``Status`` value, a channel its ``Channel`` value), timestamps are aware UTC,
and a column Cassandra may return empty is optional. The table's module in
:mod:`notiflow.adapters.cassandra` maps a driver row to one of these; the memory ports hold
them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from notiflow.schemas.enums import Status
from notiflow.schemas.locales import best_variant


@dataclass(frozen=True, slots=True)
class MessageHeadRow:
    """The columns of a message row a status transition decides on (its status, what its
    ``failures_by_tier_day`` row copies) and the write times of its creation cells
    (``created_wt``) and status cells (``status_wt``), in micro-seconds."""

    status_rank: int | None = None
    status: str | None = None
    attempt: int | None = None
    reason: str | None = None
    updated_at: datetime | None = None
    provider_id: str | None = None
    tier: str | None = None
    tenant_id: str | None = None
    channel: str | None = None
    category: str | None = None
    created_wt: int | None = None
    status_wt: int | None = None


@dataclass(frozen=True, slots=True)
class MessageRow:
    """A whole message row: the message as accepted and its current state. Only
    ``message_id`` is certain: a row whose creation cells expired before its last status
    change has only its status columns."""

    message_id: str
    tenant_id: str | None = None
    channel: str | None = None
    tier: str | None = None
    category: str | None = None
    recipient_hash: str | None = None
    recipient_masked: str | None = None
    template_id: str | None = None
    template_version: int | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    status_webhook: str | None = None
    status: str | None = None
    status_rank: int | None = None
    reason: str | None = None
    attempt: int | None = None
    provider_id: str | None = None
    provider_message_id: str | None = None
    next_attempt_at: datetime | None = None
    scheduled_at: datetime | None = None
    expires_at: datetime | None = None
    accepted_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    def current(self) -> Status:
        """The row's status; ValueError when it has none (its status cells expired before
        its creation cells)."""
        if self.status is None:
            raise ValueError(f"message {self.message_id} has no status")
        return Status(self.status)


@dataclass(frozen=True, slots=True)
class MessageEventRow:
    """One entry of a message's status history (``message_events``): a status event as
    received, ``applied`` False when a higher status had already superseded it."""

    message_id: str
    occurred_at: datetime
    event_id: str
    status: str
    attempt: int = 0
    reason: str | None = None
    source: str | None = None
    applied: bool = False


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One delivery attempt of a message."""

    message_id: str
    attempt_no: int
    provider_id: str | None = None
    provider_message_id: str | None = None
    outcome: str | None = None
    normalized_error: str | None = None
    error_code: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LocaleVariant:
    """A template version's content in one locale (``checksum``: of this content)."""

    subject: str | None
    body: str
    checksum: str


@dataclass(frozen=True, slots=True)
class TemplateRow:
    """One version of a template, as stored: its default content and its variants by
    canonical locale tag. ``checksum`` identifies the whole version (the default content's
    own when it has no variants)."""

    tenant_id: str
    template_id: str
    version: int
    channel: str
    subject: str | None
    body: str
    variables: tuple[str, ...]
    checksum: str
    created_at: datetime
    description: str | None = None
    locales: Mapping[str, LocaleVariant] = field(default_factory=dict)

    def in_locale(self, locale: str | None) -> tuple[str | None, TemplateRow | LocaleVariant]:
        """The content that serves ``locale`` (``schemas/locales.py``) and its tag (None:
        the default content)."""
        tag = best_variant(self.locales.keys(), locale)
        return (tag, self.locales[tag]) if tag is not None else (None, self)
