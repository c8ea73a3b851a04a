"""``DELETE /v1/messages/{id}``: cancel a message no provider has taken yet.

Order: auth (401) → the caller's own message row (404, as ``GET``) → its status: already
CANCELLED → 200 with the first cancel's time; not SCHEDULED, QUEUED or RETRY_PENDING → 409
``not_cancellable`` → the cancel gate in Redis (``adapters/cancel_gate.py``): a sender holds
it → 409 ``already_sending``; Redis unreachable → 503 → the CANCELLED event to
``notify.events`` (acks=all; the reconciler writes the status, the client-webhook flow
announces it) → the message's ``scheduled_work`` row removed (a SCHEDULED message's at
``scheduled_at``, a RETRY_PENDING one's long wait at ``next_attempt_at``; none there is
fine) → 200.

Once the gate says ``cancelled`` the message is never sent, whatever happens next: a 503 from
Kafka leaves the cancel in force (a retried ``DELETE`` publishes the event again; without
one the send flow ends the message CANCELLED when it reaches it), and a scheduled row that
could not be removed is released and then cancelled by the send flow. See ``docs/api.md``.
"""

from __future__ import annotations

import logging
from datetime import datetime

from fastapi import APIRouter, Response
from opentelemetry import trace as trace_api
from pydantic import ValidationError

from notiflow import names, telemetry
from notiflow.adapters.cancel_gate import CancelGate, hold_for
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.adapters.outages import CASSANDRA_DOWN, REDIS_DOWN
from notiflow.adapters.rows import MessageRow
from notiflow.gateway.auth import RuntimeDep, Tenant
from notiflow.gateway.errors import ApiError, not_found, unavailable
from notiflow.gateway.messages import MESSAGE_ID, MessageIdPath
from notiflow.gateway.openapi import Traceparent, tenant_errors
from notiflow.gateway.outbox import traceparent
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Cancelled, MessageSnapshot, StatusEvent
from notiflow.settings import Settings

log = logging.getLogger("notiflow.gateway.cancel")
router = APIRouter()

CANCELLABLE = frozenset({Status.SCHEDULED, Status.QUEUED, Status.RETRY_PENDING})
REASON = "cancelled"
SOURCE = "api"


def snapshot_of_row(row: MessageRow) -> MessageSnapshot | None:
    """The event's snapshot from the message row (None when the row lacks a field)."""
    try:
        return MessageSnapshot(
            tenant_id=row.tenant_id, channel=row.channel, tier=row.tier,
            category=row.category, template_id=row.template_id,
            template_version=row.template_version, recipient_hash=row.recipient_hash,
            recipient_masked=row.recipient_masked, accepted_at=row.accepted_at,
            expires_at=row.expires_at, scheduled_at=row.scheduled_at,
            idempotency_key=row.idempotency_key, ordering_key=row.ordering_key,
            status_webhook=row.status_webhook)
    except ValidationError:
        return None


def cancel_record(settings: Settings, row: MessageRow, message_id: str, at: datetime,
                  trace: str) -> OutRecord:
    """The CANCELLED status event of the message ``row`` as a ``notify.events`` record."""
    attempt = int(row.attempt or 0)
    ev = StatusEvent(event_id=StatusEvent.make_id(message_id, Status.CANCELLED, attempt),
                     message_id=message_id, tenant_id=row.tenant_id,
                     channel=row.channel, tier=row.tier, status=Status.CANCELLED,
                     attempt=attempt, reason=REASON, occurred_at=at, source=SOURCE,
                     message=snapshot_of_row(row))
    return OutRecord(settings.events_topic, message_id.encode(),
                     ev.model_dump_json(exclude_none=True).encode(),
                     make_headers(message_id, ev.tenant_id, ev.tier.value, trace))


async def first_cancel(store: CassandraStore, message_id: str, row: MessageRow) -> datetime:
    """When a CANCELLED message was first cancelled: its earliest CANCELLED history row
    (else the row's last update)."""
    events = await store.messages.events(message_id)
    first = min((e.occurred_at for e in events if e.status == Status.CANCELLED.value),
                default=None)
    return first or row.updated_at or now_ms()


def _answer(message_id: str, at: datetime) -> Response:
    body = Cancelled(message_id=message_id, cancelled_at=at).model_dump_json()
    return Response(body, media_type="application/json")


async def _close_gate(rt: Runtime, message_id: str, expires_at: datetime | None,
                      now: datetime) -> None:
    gate = CancelGate(rt.admission.store.r, rt.settings.topic_prefix)
    try:
        closed = await gate.cancel(message_id, hold_for(expires_at, now))
    except REDIS_DOWN as exc:
        log.warning("cancel gate unavailable: %s", type(exc).__name__)
        raise unavailable("cancel_unavailable", "cancellation is unavailable; retry "
                          "later") from None
    if not closed:
        raise ApiError(409, "conflict", "already_sending", "the message is being sent; it "
                       "can no longer be cancelled")


async def _unschedule(rt: Runtime, message_id: str, scheduled_at: datetime | None) -> None:
    if scheduled_at is None:
        return
    try:
        await rt.scheduled().unschedule(message_id, scheduled_at)
    except CASSANDRA_DOWN as exc:
        log.warning("scheduled row of cancelled %s left in place (%s): the send flow "
                    "cancels it when released", message_id, type(exc).__name__)


@router.delete(
    "/v1/messages/{message_id}", response_model=Cancelled,
    responses=tenant_errors(
        404, 409, r409="`conflict`: `not_cancellable` (with `current_status`), "
                       "`already_sending`.",
        r503="`cancel_unavailable` (Redis), `kafka_unavailable` (the cancel stands; retry).")
)
async def cancel_message(message_id: MessageIdPath, tenant: Tenant,
                         rt: RuntimeDep, trace: Traceparent = None) -> Response:
    """Cancel a message of the caller: 200 ``{message_id, status: "CANCELLED",
    cancelled_at}`` (also for a message already cancelled), else 404, 409 or 503."""
    with telemetry.span(names.API_REQUEST, {names.ATTR_TENANT_ID: tenant.id}):
        if not MESSAGE_ID.fullmatch(message_id):
            raise not_found()
        trace_api.get_current_span().set_attribute(names.ATTR_MESSAGE_ID, message_id)
        store = rt.store()
        row = await store.messages.get_message(message_id)
        if row is None or row.tenant_id != tenant.id:
            raise not_found()
        status = row.current()
        if status is Status.CANCELLED:
            return _answer(message_id, await first_cancel(store, message_id, row))
        if status not in CANCELLABLE:
            raise ApiError(409, "conflict", "not_cancellable",
                           f"the message is {status.value}; only a SCHEDULED, QUEUED or "
                           "RETRY_PENDING message can be cancelled",
                           current_status=status.value)
        now = now_ms()
        await cancel_row(rt, message_id, row, now, traceparent(trace))
        return _answer(message_id, now)


async def cancel_row(rt: Runtime, message_id: str, row: MessageRow, now: datetime,
                     trace: str) -> None:
    """Cancel a cancellable message whose row is ``row``: the gate (409 ``already_sending``,
    503), the CANCELLED event, its ``scheduled_work`` row."""
    status = row.current()
    await _close_gate(rt, message_id, row.expires_at, now)
    await rt.producer().produce(cancel_record(rt.settings, row, message_id, now, trace))
    if status is Status.SCHEDULED:
        await _unschedule(rt, message_id, row.scheduled_at)
    elif status is Status.RETRY_PENDING:
        await _unschedule(rt, message_id, row.next_attempt_at)


async def cancel_if_pending(rt: Runtime, message_id: str, now: datetime, trace: str) -> bool:
    """Cancel a message if it is still cancellable (a paused or deleted schedule's coming
    occurrence): False when it does not exist, already ended or is being sent."""
    row = await rt.store().messages.get_message(message_id)
    if row is None or row.current() not in CANCELLABLE:
        return False
    try:
        await cancel_row(rt, message_id, row, now, trace)
    except ApiError as exc:
        if exc.status == 409:
            return False
        raise
    return True
