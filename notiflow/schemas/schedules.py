"""Wire contracts of recurring schedules: ``POST /v1/schedules`` and the views of
``GET /v1/schedules[/{id}]`` (docs/api.md, "Recurring schedules")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.formats import zone
from notiflow.schemas.messages import SendRequest, Wire, derived_message_id

ScheduleState = Literal["active", "paused", "deleted"]
SCHEDULABLE_TIERS = frozenset({Tier.P2, Tier.P3})


def new_schedule_id() -> str:
    return f"sch_{uuid.uuid4().hex}"


def occurrence_message_id(schedule_id: str, at: datetime) -> str:
    """The message of one occurrence: derived from (schedule, instant), so materialising an
    occurrence twice (a crash, two schedulers) makes one message."""
    return derived_message_id("schedule", schedule_id, str(int(at.timestamp() * 1000)))


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
