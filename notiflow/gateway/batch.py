"""``POST /v1/messages:batch``: up to 1,000 send requests in one call, each with its own
idempotency key and its own answer.

Each item goes through the single request's whole acceptance
(:func:`~notiflow.gateway.messages.accept_request`: validation, lane and tenant policy,
admission, template, reservation, durable write, publish, settle); the items run
concurrently (at most ``api_batch_concurrency`` items of all batches at once in a process),
so a batch costs one round of each durable step, not one per message. The
answer is ``200`` with one result per item, in order: ``code`` (the status the single
endpoint would have answered) and that answer's body — the ``202`` body (with ``replayed:
true`` for a key seen before) or the error body (with ``retry_after`` where the single answer
had ``Retry-After``). A whole-batch problem (not JSON, not a list, too many items) is the usual
4xx for the call.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Final

from fastapi import APIRouter, Request, Response
from opentelemetry.trace import StatusCode

from notiflow import names, telemetry
from notiflow.gateway import examples
from notiflow.gateway.auth import RuntimeDep, Tenant, read_json_object
from notiflow.gateway.errors import ApiError, unprocessable
from notiflow.gateway.messages import accept_request, count_refusal, idempotency_key
from notiflow.gateway.openapi import Traceparent, errors, json_body, success
from notiflow.gateway.runtime import Runtime
from notiflow.schemas.batch import (
    MAX_ITEMS,
    BatchItem,
    BatchRequest,
    BatchResults,
    BatchUserItem,
)
from notiflow.settings import TenantConfig

log = logging.getLogger("notiflow.gateway.batch")
router = APIRouter()

MAX_BATCH_BYTES: Final = 8 * 1024 * 1024
JSON: Final = "application/json"


def _result(outcome: Response | ApiError | BaseException) -> dict[str, Any]:
    if isinstance(outcome, Response):
        body: dict[str, Any] = {"code": outcome.status_code, **json.loads(bytes(outcome.body))}
        if outcome.headers.get("Idempotent-Replayed") == "true":
            body["replayed"] = True
        return body
    if isinstance(outcome, ApiError):
        body = {"code": outcome.status, **outcome.body()}
        if "Retry-After" in outcome.headers:
            body["retry_after"] = int(outcome.headers["Retry-After"])
        return body
    return {"code": 500, "error": "internal", "reason": type(outcome).__name__,
            "message": "this message was not accepted; retry it with the same key"}


async def _item(rt: Runtime, tenant: TenantConfig, item: Any,
                trace: str | None) -> dict[str, Any]:
    labels = {"tenant": tenant.id, "channel": "", "tier": ""}
    async with rt.batch_items:
        with telemetry.span(names.API_REQUEST, {names.ATTR_TENANT_ID: tenant.id}):
            return await _accept_item(rt, tenant, item, trace, labels)


async def _accept_item(rt: Runtime, tenant: TenantConfig, item: Any, trace: str | None,
                       labels: dict[str, str]) -> dict[str, Any]:
    """One item's result; never raises (a bug in one item must not lose the others'
    answers)."""
    try:
        if not isinstance(item, dict):
            raise unprocessable("invalid_item", "each item is a send request object")
        data = dict(item)
        key = idempotency_key(data.pop("idempotency_key", None))
        return _result(await accept_request(rt, tenant, data, key, trace, labels))
    except ApiError as exc:
        count_refusal(exc, labels)
        return _result(exc)
    except Exception as exc:
        log.exception("batch item of %s failed", tenant.id)
        return _result(exc)


@router.post(
    "/v1/messages:batch", response_model=BatchResults,
    responses={**success(200, "One result per item, in order: `code` is what `POST "
                              "/v1/messages` would have answered (202, 409, 422, 429, ...).",
                         examples=examples.BATCH_RESULTS),
               **errors(400, 401, 413, 422, r413="Bodies are limited to 8 MiB.",
                               r422="`invalid_body` (not an object), `invalid_batch` "
                                    "(`messages` missing or empty), `batch_too_large`.")},
    openapi_extra=json_body(BatchRequest, "Up to 1,000 send requests.", examples.BATCH,
                            refers_to=[BatchItem, BatchUserItem]))
async def send_batch(request: Request, tenant: Tenant, rt: RuntimeDep,
                     trace: Traceparent = None) -> Response:
    """Accept up to :data:`MAX_ITEMS` send requests (``{"messages": [...]}``, each item a
    send request with an optional ``idempotency_key``); ``200 {"results": [...]}``."""
    with telemetry.span(names.API_BATCH, {names.ATTR_TENANT_ID: tenant.id}) as span:
        data = await read_json_object(request, MAX_BATCH_BYTES)
        items = data.get("messages")
        if not isinstance(items, list) or not items:
            raise unprocessable("invalid_batch", "messages must be a non-empty list",
                                field="messages")
        if len(items) > MAX_ITEMS:
            raise unprocessable("batch_too_large", f"a batch holds at most {MAX_ITEMS} "
                                f"messages, not {len(items)}", field="messages")
        results = await asyncio.gather(*(_item(rt, tenant, item, trace) for item in items))
        span.set_attribute(names.ATTR_BATCH_SIZE, len(items))
        span.set_attribute(names.ATTR_BATCH_ACCEPTED,
                           sum(1 for r in results if r["code"] == 202))
        if any(r["code"] >= 500 for r in results):
            span.set_status(StatusCode.ERROR, "items not accepted for lack of a store")
        return Response(json.dumps({"results": results}, separators=(",", ":")),
                        media_type=JSON)
