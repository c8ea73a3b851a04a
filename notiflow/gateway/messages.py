"""``POST /v1/messages`` (durable acceptance) and ``GET /v1/messages/{id}``.

Order of checks: auth (401) → ``Idempotency-Key`` shape (400) → JSON (400) → schema (422
``details``) → tenant policy (403) → channel enabled, scheduling bounds, expiry (422) →
admission control (429, 503; ``admission.py``) → template and its variables (422) →
acceptance (202, 409, 503; ``acceptance.py``). A key reserved earlier is answered from its
record even when expiry or admission would refuse the request. A request whose recipient is
``user:<id>`` is a send to a user (``user_sends.py``). See ``docs/api.md``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Request, Response
from opentelemetry import trace as trace_api
from opentelemetry.trace import StatusCode

from notiflow import names, telemetry
from notiflow.gateway import examples
from notiflow.gateway.acceptance import (
    accept,
    check_kafka_window,
    check_policy,
    effective_expiry,
    idempotency_key,
    request_hash,
    request_hashes,
    resume,
)
from notiflow.gateway.auth import RuntimeDep, Tenant, get_runtime, read_json_object
from notiflow.gateway.checks import check_lane, check_template
from notiflow.gateway.direct import tenant_of
from notiflow.gateway.egress_check import check_webhook_url
from notiflow.gateway.errors import ApiError, not_found, validated
from notiflow.gateway.openapi import (
    ACCEPTED_HEADERS,
    IdempotencyKey,
    Traceparent,
    json_body,
    link,
    success,
    tenant_errors,
)
from notiflow.gateway.outbox import traceparent
from notiflow.gateway.runtime import Runtime, now_ms
from notiflow.gateway.user_sends import accept_user_request, user_send_view
from notiflow.names import Stage
from notiflow.schemas.messages import (
    Accepted,
    AttemptView,
    MessageView,
    SendRequest,
)
from notiflow.schemas.user_sends import (
    MessageRequest,
    UserAccepted,
    UserMessageView,
    UserSendRequest,
    is_user_recipient,
)
from notiflow.settings import TenantConfig
from notiflow.stages import StageTimes

router = APIRouter()
_rejected = names.INGEST_REJECTIONS.create(telemetry.meter())

MESSAGE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
JSON = "application/json"


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
         "`invalid_body` when `scheduled_at` is not before `expires_at` or a send to a user "
         "lists a channel twice, `unknown_user` (a send to a user the tenant does not "
         "have).",
    r429="`tenant_rate`, `backlog`, `priority_pressure`, `p0_capacity`.",
    r503="`cassandra_unavailable`, `kafka_unavailable` (P0 while Kafka does not acknowledge, "
         "or any tier with the outage window off), `outage_window_full` (P1-P3: the API "
         "process's Kafka-outage window is full), `acceptance_in_progress`, "
         "`admission_unavailable` (P2/P3 without Redis), `users_unavailable` (a send to a "
         "user where users are not kept: no `NOTIFLOW_DLQ_KEY`).")


@router.post(
    "/v1/messages", status_code=202, response_model=Accepted | UserAccepted,
    responses={**success(202, "Accepted durably (stored and acknowledged by Kafka), or the "
                              "stored answer of a replayed `Idempotency-Key`.",
                         headers=ACCEPTED_HEADERS, links=MESSAGE_LINKS,
                         examples=examples.ACCEPTED),
               **SEND_REFUSALS},
    openapi_extra=json_body(MessageRequest, "One message to an address, or a send to a user "
                            "(`recipient: \"user:<id>\"`).", examples.SEND,
                            refers_to=[SendRequest, UserSendRequest]))
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
    if is_user_recipient(data):
        return await accept_user_request(rt, tenant, data, key, incoming_trace, labels)
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
                return await resume(rt, tenant.id, key, request_hashes(req), existing,
                                     trace)
        raise
    with stages.timing(Stage.API_TEMPLATE):
        await check_template(rt, tenant, req, req.variables)
    return await accept(rt, tenant, req, key, req_hash, accepted_at, expires_at, trace,
                        stages)


MessageIdPath = Annotated[str, Path(description="A `message_id` of the caller.",
                                    json_schema_extra={"pattern": MESSAGE_ID.pattern})]


@router.get("/v1/messages/{message_id}", response_model=MessageView | UserMessageView,
            responses=tenant_errors(404))
async def get_message(message_id: MessageIdPath, tenant: Tenant, rt: RuntimeDep) -> Response:
    """Current status and attempts of a message owned by the caller, or the decision of a
    send to a user with each of its messages' status; 404 otherwise."""
    if not MESSAGE_ID.fullmatch(message_id):
        raise not_found()
    store = rt.store()
    row, attempts = await asyncio.gather(store.messages.get_message(message_id),
                                         store.delivery.attempts(message_id))
    if row is None:
        user_send = await user_send_view(rt, tenant.id, message_id)
        if user_send is None:
            raise not_found()
        return Response(user_send.model_dump_json(), media_type=JSON)
    if row.tenant_id != tenant.id:
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

