"""The items of the client webhook flow: a status change read from Kafka, and the webhook
job it becomes once its message's tenant and URL are known."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from notiflow.flows.common.items import SourceRef
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.status import rank


@dataclass(frozen=True, slots=True)
class StatusChange:
    """A status of a message from ``notify.events`` or ``notify.receipts``; ``resolved``:
    tenant and URL are known (from the event's snapshot)."""

    message_id: str | None
    status: Status
    attempt: int
    reason: str | None
    occurred_at: datetime
    source: SourceRef
    tenant_id: str | None = None
    tier: Tier | None = None
    url: str | None = None
    resolved: bool = False
    provider_ref: tuple[str, str] | None = None
    """(provider_id, provider_message_id) of a receipt without a message id."""
    traceparent: str | None = None
    """The record's ``traceparent`` header (the webhook's span continues it)."""
    history: bool = False
    """Read as history (``webhook_age.py``): when too old, skipped rather than dead-lettered."""


@dataclass(frozen=True, slots=True)
class WebhookJob:
    """A status change to announce; ``tenant_id``/``url`` are None when not known yet (a
    receipt of a message whose row is not in Cassandra yet): its key learns them from
    another change of the same message."""

    message_id: str
    tenant_id: str | None
    url: str | None
    status: Status
    attempt: int
    reason: str | None
    occurred_at: datetime
    source: SourceRef
    tier: Tier | None = None
    traceparent: str | None = None

    @property
    def rank(self) -> int:
        return rank(self.status, self.attempt)
