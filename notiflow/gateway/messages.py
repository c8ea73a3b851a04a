"""``POST /v1/messages`` (durable acceptance) and ``GET /v1/messages/{id}``.

Order of checks: auth (401) → ``Idempotency-Key`` shape (400) → JSON (400) → schema (422
``details``) → tenant policy (403) → channel enabled, scheduling bounds, expiry (422) →
admission control (429, 503; ``admission.py``) → template and its variables (422) →
acceptance (202, 409, 503). A key reserved earlier is answered from its record even when
expiry or admission would refuse the request. See ``docs/api.md``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Request, Response
from opentelemetry import trace as trace_api
from opentelemetry.trace import StatusCode

from notiflow import names, telemetry
from notiflow.adapters.cassandra.idempotency import ReservationRow
from notiflow.adapters.envelope import dump, envelope, load
from notiflow.adapters.kafka_io import DeliveryFailed
from notiflow.adapters.outages import CASSANDRA_DOWN
from notiflow.gateway import examples
from notiflow.gateway.auth import RuntimeDep, Tenant, get_runtime, read_json_object
from notiflow.gateway.checks import (
    check_lane,
    check_recipient,
    check_sender,
    check_template,
)
from notiflow.gateway.direct import tenant_of
from notiflow.gateway.egress_check import check_webhook_url
from notiflow.gateway.errors import (
    ApiError,
    bad_request,
    idempotency_conflict,
    kafka_unavailable,
    not_found,
    store_unavailable,
    unavailable,
    unprocessable,
    validated,
)
from notiflow.gateway.kafka_window import Unconfirmed
from notiflow.gateway.openapi import (
    ACCEPTED_HEADERS,
    IdempotencyKey,
    Traceparent,
    json_body,
    link,
    success,
    tenant_errors,
)
from notiflow.gateway.outbox import (
    ACCEPTED,
    AUTO_KEY_PREFIX,
    complete_acceptance,
    outbox_slot,
    settle_published,
    traceparent,
    undo_acceptance,
)
from notiflow.gateway.reservation import Claim, Taken, release, reserve
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.names import Stage
from notiflow.redact import hasher, mask
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import (
    Accepted,
    AttemptView,
    IngestRecord,
    MessageView,
    SendRequest,
    new_message_id,
)
from notiflow.settings import Settings, TenantConfig
from notiflow.stages import StageTimes

log = logging.getLogger("notiflow.gateway.messages")
router = APIRouter()
_ingested = names.INGEST_MESSAGES.create(telemetry.meter())
_rejected = names.INGEST_REJECTIONS.create(telemetry.meter())

_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")
MESSAGE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
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


async def _resume(rt: Runtime, tenant_id: str, key: str, req_hashes: tuple[str, ...],
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
                 trace: str, stages: StageTimes | None = None) -> Response:
    """Reserve the key (``reservation.py``), write outbox + message row, publish, mark
    accepted (202).

    When the record is definitively not published, everything written is removed again
    and the client gets 503, so a retry with the same key starts afresh. ``stages``
    collects the latency budget of a fresh acceptance (``Server-Timing`` of the 202)."""
    times = stages or StageTimes()
    message_id = new_message_id()
    trace_api.get_current_span().set_attribute(names.ATTR_MESSAGE_ID, message_id)
    internal_key = key or f"{AUTO_KEY_PREFIX}{message_id}"
    record = IngestRecord.stamped(req, tenant_id=tenant.id, message_id=message_id,
                                  idempotency_key=key, accepted_at=accepted_at,
                                  expires_at=expires_at)
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
        return await _resume(rt, tenant.id, internal_key, claim.same_request, reserved.row,
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


REJECTION_REASONS = {400: "invalid", 421: "invalid", 422: "invalid", 409: "conflict",
                     429: "shed",
                     503: "unavailable", 401: "forbidden", 403: "forbidden"}
"""HTTP status of a refusal → ``reason`` of ``notiflow.ingest.rejections``."""


def count_refusal(exc: ApiError, labels: dict[str, str]) -> None:
    """Count one refused send request by its reason (``notiflow.ingest.rejections``)."""
    _rejected.add(1, {**labels, "reason": REJECTION_REASONS.get(exc.status, "invalid")})


MESSAGE_LINKS: Final = {
    "GetMessage": link("get_message", "The message's status.",
                       message_id="$response.body#/message_id"),
}
SEND_REFUSALS: Final = tenant_errors(
    400, 403, 409, 413, 421, 422, 429,
    r409="`idempotency_conflict` / `request_mismatch`: the key was used with another body.",
    r422="Not stated by the schema: `channel_unavailable` (no provider configured), "
         "`category_tier_not_allowed` (a category its tier may not carry: marketing is never "
         "P0 or P1), "
         "`recipient_not_served` (a CHAT webhook URL no chat provider posts to), "
         "`inbox_not_configured` (INAPP for a tenant without `inbox_keys`), "
         "`variables_too_large`, `webhook_url_not_allowed` (a `status_webhook` that is not "
         "https or does not resolve to public addresses only), "
         "`expired` (`expires_at` not in the future), "
         "`scheduled_too_far` (beyond 30 days), `unknown_template` (no such version of this "
         "channel for the tenant), `missing_template_variable` (with `variables`), "
         "`invalid_body` when `scheduled_at` is not before `expires_at`.",
    r429="`tenant_rate`, `backlog`, `priority_pressure`, `p0_capacity`.",
    r503="`cassandra_unavailable`, `kafka_unavailable` (P0 while Kafka does not acknowledge, "
         "or any tier with the outage window off), `outage_window_full` (P1-P3: the API "
         "process's Kafka-outage window is full), `acceptance_in_progress`, "
         "`admission_unavailable` (P2/P3 without Redis).")


@router.post(
    "/v1/messages", status_code=202, response_model=Accepted,
    responses={**success(202, "Accepted durably (stored and acknowledged by Kafka), or the "
                              "stored answer of a replayed `Idempotency-Key`.",
                         headers=ACCEPTED_HEADERS, links=MESSAGE_LINKS,
                         examples=examples.ACCEPTED),
               **SEND_REFUSALS},
    openapi_extra=json_body(SendRequest, "One message.", examples.SEND))
async def send_message(request: Request, tenant: Tenant, rt: RuntimeDep,
                       key: IdempotencyKey = None, trace: Traceparent = None) -> Response:
    """Accept a send request durably; 202 ``{message_id, status, accepted_at}``. Runs in a
    ``notiflow.api.request`` span; refusals are counted by reason."""
    labels = {"tenant": tenant.id, "channel": "", "tier": ""}
    with telemetry.span(names.API_REQUEST, {names.ATTR_TENANT_ID: tenant.id}) as span:
        try:
            return await _send_message(request, tenant, rt, labels, key, trace)
        except ApiError as exc:
            count_refusal(exc, labels)
            if exc.status >= 500:
                span.set_status(StatusCode.ERROR, exc.reason or exc.error)
            refused = exc
    raise refused


async def send_message_directly(request: Request) -> Response:
    """:func:`send_message` for :func:`~notiflow.gateway.direct.serve_directly`: the same
    tenant, ``Idempotency-Key`` and ``traceparent``, found without FastAPI's dependency
    solving."""
    rt = await get_runtime(request)
    tenant = await tenant_of(request, rt)
    headers = request.headers
    return await send_message(request, tenant, rt, headers.get("idempotency-key"),
                              headers.get("traceparent"))


async def _send_message(request: Request, tenant: TenantConfig, rt: Runtime,
                        labels: dict[str, str], key: str | None,
                        trace: str | None) -> Response:
    checked = idempotency_key(key)
    data = await read_json_object(request)
    return await accept_request(rt, tenant, data, checked, trace, labels)


async def accept_request(rt: Runtime, tenant: TenantConfig, data: Any, key: str | None,
                         incoming_trace: str | None, labels: dict[str, str]) -> Response:
    """One send request from its JSON body to its ``202`` (fresh, or the original answer of
    ``key``); raises :class:`ApiError` for a refusal. ``labels`` gets its channel and
    tier."""
    req = validated(SendRequest, data)
    labels.update(channel=req.channel.value, tier=req.tier.value)
    check_lane(rt.settings, req)
    trace_api.get_current_span().set_attributes(
        {names.ATTR_TIER: req.tier.value, names.ATTR_CHANNEL: req.channel.value})
    check_policy(rt.settings, tenant, req)
    await check_webhook_url(rt, req.status_webhook, "status_webhook")
    trace = traceparent(incoming_trace)
    req_hash = request_hash(req)
    accepted_at = now_ms()
    stages = StageTimes(req.tier.value)
    try:
        expires_at = effective_expiry(rt.settings, req, accepted_at)
        with stages.timing(Stage.API_ADMISSION):
            await rt.admission.check(tenant, req)
        check_kafka_window(rt, req.tier)
    except ApiError:
        if key is not None:
            existing = await rt.store().idempotency.get_reservation(tenant.id, key)
            if existing is not None:
                return await _resume(rt, tenant.id, key, request_hashes(req), existing,
                                     trace)
        raise
    with stages.timing(Stage.API_TEMPLATE):
        await check_template(rt, tenant, req, req.variables)
    return await accept(rt, tenant, req, key, req_hash, accepted_at, expires_at, trace,
                        stages)


MessageIdPath = Annotated[str, Path(description="A `message_id` of the caller.",
                                    json_schema_extra={"pattern": MESSAGE_ID.pattern})]


@router.get("/v1/messages/{message_id}", response_model=MessageView,
            responses=tenant_errors(404))
async def get_message(message_id: MessageIdPath, tenant: Tenant, rt: RuntimeDep) -> Response:
    """Current status and attempts of a message owned by the caller; 404 otherwise."""
    if not MESSAGE_ID.fullmatch(message_id):
        raise not_found()
    store = rt.store()
    row, attempts = await asyncio.gather(store.messages.get_message(message_id),
                                         store.delivery.attempts(message_id))
    if row is None or row.tenant_id != tenant.id:
        raise not_found()
    view = MessageView(
        message_id=message_id,
        status=row.current(),
        reason=row.reason,
        channel=row.channel,
        tier=row.tier,
        category=row.category,
        template_id=row.template_id,
        template_version=row.template_version,
        accepted_at=row.accepted_at,
        updated_at=row.updated_at,
        attempts=tuple(
            AttemptView(
                attempt_no=a.attempt_no, provider_id=a.provider_id,
                provider_message_id=a.provider_message_id, outcome=a.outcome,
                normalized_error=a.normalized_error, started_at=a.started_at,
                completed_at=a.completed_at,
            )
            for a in attempts
        ),
    )
    return Response(view.model_dump_json(), media_type=JSON)

