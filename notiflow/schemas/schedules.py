"""Wire contracts of recurring schedules: ``POST /v1/schedules`` and the views of
``GET /v1/schedules[/{id}]`` (docs/api.md, "Recurring schedules")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.formats import zone
from notiflow.schemas.messages import SendRequest, Wire

if TYPE_CHECKING:
    from notiflow.correlation import CorrelationKeys

ScheduleState = Literal["active", "paused", "deleted"]
SCHEDULABLE_TIERS = frozenset({Tier.P2, Tier.P3})


def new_schedule_id() -> str:
    return f"sch_{uuid.uuid4().hex}"


OCCURRENCE_PURPOSE = "schedule-occurrence"
"""What an occurrence message id's tags are made over, with the schedule id and the instant."""


def occurrence_message_ids(keys: CorrelationKeys, schedule_id: str, at: datetime
                           ) -> tuple[str, ...]:
    """The ids the occurrence at ``at`` of ``schedule_id`` has under each of ``keys`` (the
    current key's first): what cancels it after a key rotation."""
    instant = str(int(at.timestamp() * 1000))
    return tuple(f"msg_{t}" for t in keys.tags_each(OCCURRENCE_PURPOSE, schedule_id, instant,
                                                     length=32))


def occurrence_message_id(keys: CorrelationKeys, schedule_id: str, at: datetime) -> str:
    """The message of one occurrence, ``msg_`` and 32 characters keyed over (schedule,
    instant): materialising an occurrence twice (a crash, two schedulers) makes one message,
    and nobody without the keys can name it from the schedule id and the time."""
    return occurrence_message_ids(keys, schedule_id, at)[0]


def _schedule_rules(schema: dict[str, Any]) -> None:
    schema["oneOf"] = [
        {"required": ["cron"], "properties": {"cron": {"type": "string"},
                                              "rrule": {"type": "null"}}},
        {"required": ["rrule"], "properties": {"rrule": {"type": "string"},
                                               "cron": {"type": "null"}}}]
    schema["properties"]["timezone"] = zone("recipient")
    schema["properties"]["message"] = {"allOf": [
        schema["properties"]["message"],
        {"properties": {"tier": {"enum": ["P2", "P3"]}, "scheduled_at": {"type": "null"},
                        "expires_at": {"type": "null"}}}]}


class ScheduleRequest(Wire):
    """Body of ``POST /v1/schedules``: exactly one of ``cron`` (five fields) and ``rrule``
    (RFC 5545, without DTSTART), evaluated in ``timezone``; ``message`` is a send request
    without ``scheduled_at`` and ``expires_at`` (each occurrence expires after its tier TTL),
    of tier P2 or P3."""

    model_config = ConfigDict(json_schema_extra=_schedule_rules)

    cron: str | None = Field(None, min_length=1, max_length=256)
    rrule: str | None = Field(None, min_length=1, max_length=1024)
    timezone: str | None = Field(None, min_length=1, max_length=64)
    """An IANA zone, ``recipient`` (the recipient's stored zone, else an SMS number's), or
    None: the tenant's configured zone (``UTC`` unless set)."""
    starts_at: AwareDatetime | None = None
    ends_at: AwareDatetime | None = None
    message: SendRequest

    @model_validator(mode="after")
    def _one_message_per_occurrence(self) -> ScheduleRequest:
        if self.message.scheduled_at is not None or self.message.expires_at is not None:
            raise ValueError("message: scheduled_at and expires_at come from the schedule")
        if self.message.tier not in SCHEDULABLE_TIERS:
            raise ValueError("message: only P2 and P3 messages can be scheduled")
        return self


class ScheduleView(Wire):
    """One schedule as ``GET /v1/schedules/{id}`` shows it; ``next``: its coming occurrences
    (none while paused)."""

    schedule_id: str
    state: ScheduleState
    cron: str | None = None
    rrule: str | None = None
    timezone: str
    starts_at: datetime
    ends_at: datetime | None = None
    channel: Channel
    tier: Tier
    template_id: str
    template_version: int
    recipient_masked: str
    materialized_until: datetime | None = None
    created_at: datetime
    updated_at: datetime
    next: tuple[datetime, ...] = ()


class ScheduleStopped(ScheduleView):
    """A paused or deleted schedule, with the occurrences its stop cancelled."""

    cancelled_occurrences: int


class ScheduleList(Wire):
    """``GET /v1/schedules``: the caller's schedules (deleted ones left out)."""

    schedules: tuple[ScheduleView, ...]
