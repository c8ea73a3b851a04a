"""Durable acceptance of one message: the request's hash, the checks every message passes
after validation (tenant policy, expiry, the Kafka window), and :func:`accept` (reserve the
key, write outbox and message row, publish, answer ``202``), with the replay of a key
reserved earlier (:func:`resume`). Used by ``POST /v1/messages``, its batch and sends to a
user."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime

from fastapi import Response
from opentelemetry import trace as trace_api

from notiflow import names, telemetry
from notiflow.adapters.cassandra.idempotency import ReservationRow
from notiflow.adapters.envelope import dump, envelope, load
from notiflow.adapters.kafka_io import DeliveryFailed
from notiflow.adapters.outages import CASSANDRA_DOWN
from notiflow.gateway.checks import check_recipient, check_sender
from notiflow.gateway.errors import (
    ApiError,
    bad_request,
    idempotency_conflict,
    kafka_unavailable,
    store_unavailable,
    unavailable,
    unprocessable,
)
from notiflow.gateway.kafka_window import Unconfirmed
from notiflow.gateway.outbox import (
    ACCEPTED,
    AUTO_KEY_PREFIX,
    complete_acceptance,
    outbox_slot,
    settle_published,
    undo_acceptance,
)
from notiflow.gateway.reservation import Claim, Taken, release, reserve
from notiflow.gateway.runtime import Runtime
from notiflow.names import Stage
from notiflow.redact import hasher, mask
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import IngestRecord, SendRequest, UserStamp, new_message_id
from notiflow.settings import Settings, TenantConfig
from notiflow.stages import StageTimes

log = logging.getLogger("notiflow.gateway.acceptance")
_ingested = names.INGEST_MESSAGES.create(telemetry.meter())

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
JSON = "application/json"
_PUBLISH_ERRORS: tuple[type[Exception], ...] = (DeliveryFailed, *CASSANDRA_DOWN)


def _canonical(req: SendRequest) -> bytes:
    """The validated request as canonical JSON (sorted keys); excludes everything the API
    adds (message id, acceptance time, default expiry), and ``sender`` when unset (a key
    reserved before senders existed keeps its hash)."""
    fields = req.model_dump(mode="json")
    if fields.get("sender") is None:
        fields.pop("sender", None)
    return json.dumps(fields, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()


def request_hash(req: SendRequest) -> str:
    """The hash a reservation records: HMAC-SHA-256 of the canonical request under the
    recipient hash key (the request holds the recipient: an unkeyed hash could be matched
    to it by enumeration)."""
    return hasher().digest(_canonical(req))


def request_hashes(req: SendRequest) -> tuple[str, ...]:
    """Every hash a reservation of the same request may hold: under each configured key,
    and the unkeyed SHA-256 of earlier releases while ``recipient_hash_legacy`` is on."""
    return hasher().digests(_canonical(req))


def idempotency_key(value: str | None) -> str | None:
    """The client's key (1-255 printable ASCII characters, no spaces) or None; 400 otherwise."""
    if value is None:
        return None
    if not _IDEMPOTENCY_KEY.fullmatch(value):
        raise bad_request("invalid_idempotency_key",
                          "Idempotency-Key must be 1-255 printable ASCII characters")
    return value


def check_policy(settings: Settings, tenant: TenantConfig, req: SendRequest) -> None:
    """:func:`~notiflow.gateway.checks.check_sender`, then 422 for a chat webhook no provider
    serves or an inbox nobody can open (:func:`~notiflow.gateway.checks.check_recipient`) and
    for variables over the size limit."""
    check_sender(settings, tenant, req)
    check_recipient(settings, tenant, req.channel, req.recipient)
    size = len(json.dumps(req.variables, separators=(",", ":")).encode())
    if size > settings.max_variables_bytes:
        raise unprocessable("variables_too_large",
                            f"variables take {size} bytes, at most "
                            f"{settings.max_variables_bytes} are allowed")


def effective_expiry(settings: Settings, req: SendRequest, accepted_at: datetime) -> datetime:
    """The client's ``expires_at`` (must be in the future), else the tier TTL counted from
    ``scheduled_at`` when that is later than acceptance, else from acceptance."""
    if req.scheduled_at is not None and req.scheduled_at - accepted_at > settings.operational_ttl:
        raise unprocessable("scheduled_too_far",
                            "scheduled_at lies beyond the retention of operational data "
                            f"({settings.operational_ttl.days} days)")
    if req.expires_at is not None:
        if req.expires_at <= accepted_at:
            raise unprocessable("expired", "expires_at is in the past")
        return req.expires_at.astimezone(UTC)
    base = accepted_at
    if req.scheduled_at is not None and req.scheduled_at > accepted_at:
        base = req.scheduled_at.astimezone(UTC)
    return base + settings.tier_ttl(req.tier)


def _accepted(body: str, message_id: str, trace: str, *, replayed: bool = False,
              stages: StageTimes | None = None) -> Response:
    headers = {"Location": f"/v1/messages/{message_id}", "traceparent": trace}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    if stages is not None and stages.seconds:
        headers["Server-Timing"] = stages.server_timing()
    return Response(body, status_code=202, media_type=JSON, headers=headers)


async def resume(rt: Runtime, tenant_id: str, key: str, req_hashes: tuple[str, ...],
                  existing: ReservationRow, trace: str) -> Response:
    """A key that was reserved before: 409 for another request, the stored response when
    accepted, otherwise finish the earlier acceptance with its stored payload."""
    span = trace_api.get_current_span()
    span.set_attribute("notiflow.idempotent_replay", True)
    if existing.message_id:
        span.set_attribute(names.ATTR_MESSAGE_ID, existing.message_id)
    if existing.request_hash not in req_hashes:
        raise idempotency_conflict()
    stored = existing.response if existing.state == ACCEPTED else None
    answered = stored or rt.settler.pending(tenant_id, key)
    if answered:
        return _accepted(answered, existing.message_id or json.loads(answered)["message_id"],
                         trace, replayed=True)
    payload, topic, created_at = existing.payload, existing.topic, existing.created_at
    if not payload or not topic or created_at is None:
        raise unavailable("acceptance_in_progress", "an earlier request with this key is "
                          "still being accepted")
    record = load(payload, envelope(rt.settings))
    try:
        body = await complete_acceptance(rt, tenant_id=tenant_id, key=key,
                                         created_at=created_at, record=record, topic=topic,
                                         payload=payload, trace=trace,
                                         slot=outbox_slot(tenant_id, key, created_at))
    except (DeliveryFailed, Unconfirmed) as exc:
        raise kafka_unavailable(exc) from None
    except CASSANDRA_DOWN as exc:
        raise store_unavailable(exc) from None
    return _accepted(body, str(record.message_id), trace, replayed=True)


async def accept(rt: Runtime, tenant: TenantConfig, req: SendRequest, key: str | None,
                 req_hash: str, accepted_at: datetime, expires_at: datetime,
                 trace: str, stages: StageTimes | None = None, *,
                 message_id: str | None = None, user: UserStamp | None = None) -> Response:
    """Reserve the key (``reservation.py``), write outbox + message row, publish, mark
    accepted (202).

    When the record is definitively not published, everything written is removed again
    and the client gets 503, so a retry with the same key starts afresh. ``stages``
    collects the latency budget of a fresh acceptance (``Server-Timing`` of the 202);
    ``message_id`` is minted when not given; ``user`` is stamped on the record of a send to
    a user."""
    times = stages or StageTimes()
    message_id = message_id or new_message_id()
    trace_api.get_current_span().set_attribute(names.ATTR_MESSAGE_ID, message_id)
    internal_key = key or f"{AUTO_KEY_PREFIX}{message_id}"
    record = IngestRecord.stamped(req, tenant_id=tenant.id, message_id=message_id,
                                  idempotency_key=key, accepted_at=accepted_at,
                                  expires_at=expires_at, user=user)
    payload = dump(record, envelope(rt.settings))
    topic = rt.settings.ingest_topic(req.channel, req.tier)
    store = rt.store()
    claim = Claim(tenant.id, internal_key, req_hash, message_id, topic, payload, accepted_at,
                  request_hashes(req))
    try:
        with times.timing(Stage.API_RESERVE):
            reserved = await reserve(store, rt.fence, claim, client_key=key is not None)
    except CASSANDRA_DOWN as exc:
        raise store_unavailable(exc) from None
    if isinstance(reserved, Taken):
        return await resume(rt, tenant.id, internal_key, claim.same_request, reserved.row,
                             trace)

    async def release_fence() -> None:
        await release(rt.fence, tenant.id, internal_key, reserved.fence)

    slot = outbox_slot(tenant.id, internal_key, accepted_at)
    try:
        body = await complete_acceptance(rt, tenant_id=tenant.id, key=internal_key,
                                         created_at=accepted_at, record=record, topic=topic,
                                         payload=payload, trace=trace, slot=slot, fresh=True,
                                         stages=times, also=reserved.writes,
                                         release=release_fence)
    except Unconfirmed as exc:
        raise kafka_unavailable(exc) from None
    except _PUBLISH_ERRORS as exc:
        undone = await undo_acceptance(rt.store(), tenant_id=tenant.id, key=internal_key,
                                       created_at=accepted_at, record=record, slot=slot,
                                       scheduled=rt.scheduled())
        if undone:
            await release_fence()
            if isinstance(exc, DeliveryFailed):
                raise kafka_unavailable(exc) from None
            raise store_unavailable(exc) from None
        body = await settle_published(rt.store(), tenant_id=tenant.id, key=internal_key,
                                      created_at=accepted_at, record=record, slot=slot)
    log.debug("accepted %s tenant=%s %s/%s recipient=%s", message_id, tenant.id,
              req.channel.value, req.tier.value, mask(req.recipient_key()))
    _ingested.add(1, {"tenant": tenant.id, "channel": req.channel.value,
                      "tier": req.tier.value, "source": "api"})
    if req.tier is Tier.P0:
        rt.auditor.count_p0(tenant.id)
    times.record()
    return _accepted(body, message_id, trace, stages=times)


def check_kafka_window(rt: Runtime, tier: Tier) -> None:
    """503 with ``Retry-After`` before anything is written when Kafka is known down and the
    acceptance could not be honoured: P0 (its SLA), or P1-P3 with the outage window full."""
    reason = rt.window.refusal(tier)
    if reason is None:
        return
    message = ("the message log is not acknowledging; P0 cannot meet its SLA"
               if reason == "kafka_unavailable" else
               "the message log is not acknowledging and this process's outage window is "
               "full")
    raise ApiError(503, "unavailable", reason, message,
                   headers={"Retry-After": str(rt.window.retry_after_s())})
