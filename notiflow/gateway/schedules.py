"""Recurring schedules: ``POST /v1/schedules``, ``GET /v1/schedules[/{id}]``,
``DELETE /v1/schedules/{id}``, ``POST /v1/schedules/{id}/pause|resume`` (tenant-scoped).

Creating checks, in order: JSON and schema (422 ``details``: both or neither of ``cron`` and
``rrule``, a ``message`` with ``scheduled_at``/``expires_at`` or of tier P0/P1) → lane (421)
→ the message's tenant policy (403) and channel (422) → its template (422) → the recurrence
(422 ``invalid_schedule`` naming ``field``: malformed cron or RRULE, unknown time zone, an
empty or too dense schedule; parsed off the event loop: a pathological RRULE costs up to a
second of CPU). Schedulers materialise occurrences ``scheduling.horizon``
ahead (``flows/scheduling/recurring.py``); pausing or deleting cancels the occurrences already made
that are still cancellable, resuming skips the ones missed while paused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from datetime import datetime, timedelta
from typing import Final

from fastapi import APIRouter, Request, Response

from notiflow.adapters.schedule_store import ScheduleRow, ScheduleStore
from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.gateway import examples
from notiflow.gateway.acceptance import check_policy
from notiflow.gateway.auth import RuntimeDep, Tenant, read_model
from notiflow.gateway.cancel import cancel_if_pending
from notiflow.gateway.checks import check_lane, check_template
from notiflow.gateway.egress_check import check_webhook_url
from notiflow.gateway.errors import not_found, unavailable, unprocessable
from notiflow.gateway.openapi import json_body, link, location, success, tenant_errors
from notiflow.gateway.outbox import traceparent
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.redact import mask, recipient_hash
from notiflow.schemas.enums import Channel
from notiflow.schemas.preferences import phone_timezone
from notiflow.schemas.recurrence import RecurrenceError, occurrences, parse_recurrence
from notiflow.schemas.schedules import (
    ScheduleList,
    ScheduleRequest,
    ScheduleState,
    ScheduleStopped,
    ScheduleView,
    new_schedule_id,
    occurrence_message_ids,
)
from notiflow.settings import TenantConfig

router = APIRouter()
JSON = "application/json"
PREVIEW = 5
PREVIEW_SPAN = timedelta(days=400)
RECIPIENT_ZONE = "recipient"


_ID = "$response.body#/schedule_id"
SCHEDULE_LINKS: Final = {
    "GetSchedule": link("get_schedule", "The schedule.", schedule_id=_ID),
    "PauseSchedule": link("pause_schedule", "Pause it.", schedule_id=_ID),
    "ResumeSchedule": link("resume_schedule", "Resume it.", schedule_id=_ID),
    "DeleteSchedule": link("delete_schedule", "Delete it.", schedule_id=_ID),
}


def _store(rt: Runtime) -> ScheduleStore:
    return rt.schedules()




def view(row: ScheduleRow, now: datetime) -> ScheduleView:
    until = row.ends_at or now + PREVIEW_SPAN
    coming = (occurrences(row.recurrence(), now, until, limit=PREVIEW)
              if row.state == "active" and until > now else [])
    return ScheduleView(
        schedule_id=row.schedule_id, state=row.state,
        cron=row.expression if row.kind == "cron" else None,
        rrule=row.expression if row.kind == "rrule" else None, timezone=row.timezone,
        starts_at=row.starts_at, ends_at=row.ends_at, channel=row.channel, tier=row.tier,
        template_id=row.template_id, template_version=row.template_version,
        recipient_masked=row.recipient_masked, materialized_until=row.materialized_until,
        created_at=row.created_at, updated_at=row.updated_at, next=tuple(coming))


async def resolve_zone(rt: Runtime, tenant: TenantConfig, req: ScheduleRequest) -> str:
    """The zone the schedule is evaluated in: the request's, the recipient's (``recipient``:
    stored preferences, else an SMS number's zone; 422 when neither is known), or the
    tenant's."""
    if req.timezone is None:
        return tenant.timezone
    if req.timezone != RECIPIENT_ZONE:
        return req.timezone
    msg = req.message
    state = await rt.preferences().get_state(
        tenant.id, recipient_hash(tenant.id, msg.recipient_key()))
    zone = state.timezone if state is not None else None
    if zone is None and msg.channel is Channel.SMS and isinstance(msg.recipient, str):
        zone = phone_timezone(msg.recipient)
    if zone is None:
        raise unprocessable("invalid_schedule", "the recipient has no known time zone",
                            field="timezone")
    return zone


@router.post(
    "/v1/schedules", status_code=201, response_model=ScheduleView,
    responses={**success(201, "The schedule with its next occurrences.",
                         headers=location("the schedule"), links=SCHEDULE_LINKS),
               **tenant_errors(
                   400, 403, 413, 421, 422,
                   r422="`invalid_body`; not stated by the schema: `invalid_schedule` (with "
                        "`field`: a malformed cron or RRULE, an unknown zone, a schedule that "
                        "never fires or fires too often), `channel_unavailable`, "
                        "`category_tier_not_allowed`, "
                        "`recipient_not_served`, `inbox_not_configured`, "
                        "`variables_too_large`, `webhook_url_not_allowed`, "
                        "`unknown_template`, "
                        "`missing_template_variable`.")},
    openapi_extra=json_body(ScheduleRequest, "A message repeated on a cron expression or an "
                                             "RRULE.", examples.SCHEDULE))
async def create_schedule(request: Request, tenant: Tenant, rt: RuntimeDep) -> Response:
    """Create a recurring schedule of one message: 201 with the schedule and its next
    occurrences."""
    req = await read_model(request, ScheduleRequest)
    msg = req.message
    check_lane(rt.settings, msg)
    check_policy(rt.settings, tenant, msg)
    await check_webhook_url(rt, msg.status_webhook, "message.status_webhook")
    await check_template(rt, tenant, msg, msg.variables)
    now = now_ms()
    zone = await resolve_zone(rt, tenant, req)
    try:
        rec = await asyncio.to_thread(functools.partial(
            parse_recurrence, cron=req.cron, rrule=req.rrule, timezone=zone,
            starts_at=req.starts_at or now, ends_at=req.ends_at,
            min_interval=rt.settings.scheduling.min_interval))
    except RecurrenceError as exc:
        raise unprocessable("invalid_schedule", exc.reason, field=exc.field) from None
    row = ScheduleRow(
        tenant.id, new_schedule_id(), rec.kind, rec.expression, rec.timezone, rec.starts_at,
        rec.ends_at, msg.channel.value, msg.tier.value, msg.template_id, msg.template_version,
        mask(msg.recipient_key()), msg.model_dump_json(), "active", None, now, now)
    await _store(rt).create(row)
    return Response(view(row, now).model_dump_json(), status_code=201, media_type=JSON,
                    headers={"Location": f"/v1/schedules/{row.schedule_id}"})


@router.get("/v1/schedules", response_model=ScheduleList, responses=tenant_errors())
async def list_schedules(tenant: Tenant, rt: RuntimeDep) -> Response:
    now = now_ms()
    rows = [r for r in await _store(rt).of_tenant(tenant.id) if r.state != "deleted"]
    body = ScheduleList(schedules=tuple(view(r, now) for r in rows))
    return Response(body.model_dump_json(), media_type=JSON)


async def _own(rt: Runtime, tenant_id: str, schedule_id: str) -> ScheduleRow:
    row = await _store(rt).get(tenant_id, schedule_id)
    if row is None or row.state == "deleted":
        raise not_found()
    return row


@router.get("/v1/schedules/{schedule_id}", response_model=ScheduleView,
            responses=tenant_errors(404))
async def get_schedule(schedule_id: str, tenant: Tenant, rt: RuntimeDep) -> Response:
    row = await _own(rt, tenant.id, schedule_id)
    return Response(view(row, now_ms()).model_dump_json(), media_type=JSON)


def _occurrence_keys(rt: Runtime) -> CorrelationKeys:
    """The keys occurrence message ids are made with; 503 when none is configured."""
    try:
        return CorrelationKeys.from_settings(rt.settings)
    except CorrelationKeyMissing:
        raise unavailable("correlation_key_missing",
                          "no correlation key is configured") from None


async def _stop(rt: Runtime, row: ScheduleRow, state: ScheduleState, request: Request
                ) -> Response:
    """Pause or delete: the state first (no more occurrences are made), then cancel the
    occurrences already made that no provider took yet."""
    now = now_ms()
    store = _store(rt)
    made = row.materialized_until is not None and row.state == "active"
    keys = _occurrence_keys(rt) if made else None
    await store.set_state(row, state, now, row.materialized_until)
    cancelled = 0
    if keys is not None and row.materialized_until is not None:
        trace = traceparent(request.headers.get("traceparent"))
        for at in occurrences(row.recurrence(), now, row.materialized_until):
            for message_id in occurrence_message_ids(keys, row.schedule_id, at):
                if await cancel_if_pending(rt, message_id, now, trace):
                    cancelled += 1
                    break
    updated = dataclasses.replace(row, state=state, updated_at=now)
    body = json.loads(view(updated, now).model_dump_json())
    return Response(json.dumps({**body, "cancelled_occurrences": cancelled}),
                    media_type=JSON)


@router.delete("/v1/schedules/{schedule_id}", response_model=ScheduleStopped,
               responses=tenant_errors(404))
async def delete_schedule(schedule_id: str, request: Request, tenant: Tenant,
                          rt: RuntimeDep) -> Response:
    return await _stop(rt, await _own(rt, tenant.id, schedule_id), "deleted", request)


@router.post("/v1/schedules/{schedule_id}/pause", response_model=ScheduleStopped,
             responses=tenant_errors(404))
async def pause_schedule(schedule_id: str, request: Request, tenant: Tenant,
                         rt: RuntimeDep) -> Response:
    return await _stop(rt, await _own(rt, tenant.id, schedule_id), "paused", request)


@router.post("/v1/schedules/{schedule_id}/resume", response_model=ScheduleView,
             responses=tenant_errors(404))
async def resume_schedule(schedule_id: str, tenant: Tenant, rt: RuntimeDep) -> Response:
    """Resume from now: occurrences missed while paused are skipped."""
    row = await _own(rt, tenant.id, schedule_id)
    now = now_ms()
    store = _store(rt)
    if row.state != "active":
        await store.set_state(row, "active", now, now)
        row = dataclasses.replace(row, state="active", updated_at=now, materialized_until=now)
    return Response(view(row, now).model_dump_json(), media_type=JSON)
