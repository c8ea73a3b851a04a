"""The OpenAPI 3.1 document of the Messaging API, declared once: the error responses each
route lists (all with :class:`~notiflow.gateway.errors.ErrorBody`), the response headers,
the request bodies of routes that read their JSON themselves, and the links between
operations. Routes pass these to FastAPI (``responses=``, ``openapi_extra=``); :func:`install`
adds the request body models to the document's components. ``docs/api.md`` ("OpenAPI")
says what the document guarantees."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final

from fastapi import FastAPI, Header
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from notiflow.gateway.errors import ErrorBody

Responses = dict[int | str, dict[str, Any]]
JSON: Final = "application/json"
REF: Final = "#/components/schemas/{model}"

RETRY_AFTER: Final = {"Retry-After": {
    "description": "Seconds to wait before retrying (whole seconds, at least 1).",
    "required": True, "schema": {"type": "integer", "minimum": 1}}}
WWW_AUTHENTICATE: Final = {"WWW-Authenticate": {
    "description": "Always ``Bearer``.", "required": True, "schema": {"type": "string"}}}


def location(what: str) -> dict[str, Any]:
    """A required ``Location`` response header naming the created resource."""
    return {"Location": {"description": f"The path of {what}.", "required": True,
                         "schema": {"type": "string", "format": "uri-reference"}}}


ACCEPTED_HEADERS: Final = {
    **location("the message (`/v1/messages/{message_id}`)"),
    "traceparent": {"description": "W3C trace context of the ingest record.",
                    "required": True, "schema": {"type": "string"}},
    "Idempotent-Replayed": {"description": "`true` when this is the stored answer of an "
                                           "`Idempotency-Key` seen before.",
                            "schema": {"type": "string", "enum": ["true"]}},
    "Server-Timing": {"description": "The acceptance's latency budget per stage (ms).",
                      "schema": {"type": "string"}},
}

IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key",
    description="Makes retries safe: the same key with the same body answers the first "
                "answer; with another body 409 (keys are kept 24 h per tenant). A malformed "
                "key is 400 `invalid_idempotency_key`.",
    json_schema_extra={"minLength": 1, "maxLength": 255, "pattern": r"^[\x21-\x7e]+$"},
    examples=["order-1042-otp"])]
Traceparent = Annotated[str | None, Header(
    alias="traceparent",
    description="W3C trace context to continue (a malformed one starts a new trace).")]

ERRORS: Final[Mapping[int, str]] = {
    400: "Bad request: `malformed_json`, `empty_body`, `invalid_idempotency_key`.",
    401: "No valid credentials (`missing_token`, `malformed_authorization`, "
         "`unknown_token`; for JWTs `malformed_token`, `unsupported_algorithm`, `missing_kid`, "
         "`unknown_key`, `token_expired`, `token_not_yet_valid`, `wrong_audience`, "
         "`wrong_issuer`, `missing_claim`, `invalid_claim`, `bad_signature`, "
         "`invalid_token`).",
    403: "Forbidden; `reason` says why (for a JWT: `insufficient_scope`, `unknown_tenant`).",
    404: "Unknown, or another tenant's: the body is exactly `{\"error\": \"not_found\"}`.",
    409: "Conflict with the stored state.",
    413: "The body is over the size limit (`body_too_large`).",
    421: "This API process serves the other lane (`misdirected` / `wrong_lane`); only from "
         "a deployment that runs the priority and bulk lanes apart.",
    422: "The request is well formed but cannot be accepted: schema failures "
         "(`invalid_body`, `invalid_request`, with `details`) and the rules a schema cannot "
         "state, named by `reason`.",
    429: "Refused by admission control; retry after `Retry-After`.",
    503: "A dependency (Cassandra, Kafka, Redis) is unavailable; nothing was changed that "
         "a retry would duplicate. Retry after `Retry-After`.",
}
"""What each error status means, wherever it occurs; a route adds its own reasons."""

_HEADERS: Final[Mapping[int, Mapping[str, Any]]] = {
    401: WWW_AUTHENTICATE, 429: RETRY_AFTER, 503: RETRY_AFTER}


def errors(*codes: int, **reasons: str) -> Responses:
    """``responses=`` entries for the error statuses a route answers, each with the one
    error body and the headers that status always carries; ``r422="..."`` appends the
    route's own reasons to the description of 422 (likewise for any status)."""
    out: Responses = {}
    for code in codes:
        text = ERRORS[code]
        extra = reasons.get(f"r{code}")
        entry: dict[str, Any] = {"model": ErrorBody,
                                 "description": f"{text} {extra}" if extra else text}
        if code in _HEADERS:
            entry["headers"] = dict(_HEADERS[code])
        out[code] = entry
    return out


TENANT_ERRORS: Final = (401, 403, 503)
"""Every tenant route: the token (a JWT's scope or tenant: 403), and the store or the identity
provider being unavailable."""


def tenant_errors(*codes: int, **reasons: str) -> Responses:
    """:func:`errors` with 401 and 503, which every tenant route can answer."""
    if 403 in codes:
        reasons.setdefault("r403", "The tenant may not use this tier, channel, template or "
                                   "sender (`tier_not_allowed`, `channel_not_allowed`, "
                                   "`template_not_allowed`, `sender_not_allowed`), or a JWT "
                                   "lacks the scope "
                                   "(`insufficient_scope`) or names no configured tenant "
                                   "(`unknown_tenant`).")
    return errors(*sorted({*codes, *TENANT_ERRORS}), **reasons)


def success(code: int, description: str, *, headers: Mapping[str, Any] | None = None,
            links: Mapping[str, Any] | None = None,
            examples: Mapping[str, Any] | None = None,
            model: type[BaseModel] | None = None) -> Responses:
    """A success entry to merge with the route's ``response_model`` (headers, links and
    named examples of the body); ``model`` for a status other than the route's own."""
    entry: dict[str, Any] = {"description": description}
    if model is not None:
        entry["model"] = model
    if headers:
        entry["headers"] = dict(headers)
    if links:
        entry["links"] = dict(links)
    if examples:
        entry["content"] = {JSON: {"examples": {k: {"value": v} for k, v in examples.items()}}}
    return {code: entry}


def link(operation_id: str, description: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link: call ``operation_id`` with ``parameters`` taken from this
    response (runtime expressions such as ``$response.body#/message_id``)."""
    return {"operationId": operation_id, "description": description,
            "parameters": parameters}


_BODIES: dict[str, type[BaseModel]] = {}


def json_body(model: type[BaseModel], description: str,
              examples: Mapping[str, Any] | None = None,
              refers_to: Iterable[type[BaseModel]] = ()) -> dict[str, Any]:
    """``openapi_extra=`` for a route that reads its JSON body itself (to answer 400, 413
    and 422 its own way): the body is ``model``, added to the components by
    :func:`install` with the models its schema names by hand (``refers_to``)."""
    for m in (model, *refers_to):
        _BODIES[m.__name__] = m
    content: dict[str, Any] = {"schema": {"$ref": REF.format(model=model.__name__)}}
    if examples:
        content["examples"] = {k: {"value": v} for k, v in examples.items()}
    return {"requestBody": {"required": True, "description": description,
                            "content": {JSON: content}}}


def raw_body(description: str, content: Mapping[str, Any]) -> dict[str, Any]:
    """``openapi_extra=`` for a body that is not a pydantic model (webhook payloads)."""
    return {"requestBody": {"required": True, "description": description,
                            "content": dict(content)}}


def operation_id(route: APIRoute) -> str:
    """The operation id of a route: its function's name (unique in this API)."""
    return route.name


def body_schemas(models: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """JSON Schema of ``models`` and everything they refer to, as component schemas."""
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    defs: dict[str, Any] = top.get("$defs", {})
    return defs


DESCRIPTION: Final = (
    "notiflow's Messaging API. Tenant routes (`/v1/...`) authenticate with "
    "`Authorization: Bearer <token>`; provider webhooks (`/webhooks/...`) with the "
    "provider's signature. Every error is one JSON shape (`ErrorBody`). "
    "Schema-valid requests are refused only for the reasons each 422 lists (rules that "
    "depend on stored state, the clock or the deployment).")


_FASTAPI_422: Final = REF.format(model="HTTPValidationError")


def _drop_default_422(doc: dict[str, Any]) -> None:
    """Remove the 422 FastAPI lists for every route with parameters: the error handler
    answers :class:`ErrorBody`, and the routes whose parameters can fail declare it."""
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            answer = operation.get("responses", {}).get("422", {})
            schema = answer.get("content", {}).get(JSON, {}).get("schema", {})
            if schema.get("$ref") == _FASTAPI_422:
                del operation["responses"]["422"]
    for name in ("HTTPValidationError", "ValidationError"):
        doc["components"]["schemas"].pop(name, None)


def install(app: FastAPI) -> None:
    """Serve the document with the request body models of :func:`json_body` among its
    component schemas (a route that reads its body itself gives FastAPI no model)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=DESCRIPTION,
                          openapi_version=app.openapi_version, routes=app.routes)
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in body_schemas(_BODIES.values()).items():
            schemas.setdefault(name, schema)
        _drop_default_422(doc)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
