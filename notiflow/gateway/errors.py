"""Error responses of the Messaging API.

Every error is a JSON object ``{"error": <code>, "reason": <specific code>, "message":
<text>}`` (schema failures carry ``details`` instead of ``message``). Infrastructure failures
(Cassandra unreachable or timing out, Kafka not acknowledging) become ``503`` with
``Retry-After``. Messages never contain recipient data.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from notiflow.adapters.admission import retry_after_s
from notiflow.adapters.cassandra.recipients import StateContention
from notiflow.adapters.kafka_io import DeliveryFailed
from notiflow.adapters.outages import CASSANDRA_DOWN

log = logging.getLogger("notiflow.gateway")

RETRY_AFTER_S = 5


class ErrorDetail(BaseModel):
    """One schema failure: where (``loc``, without the input value), what and its type."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(BaseModel):
    """The one body of every error answer. Some reasons add fields of their own
    (``current_status``, ``variables``, ``field``, ``line``, ``checks``): documented with the
    reason in ``docs/api.md``."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [
        {"error": "validation_failed", "reason": "unknown_template",
         "message": "template otp version 3 does not exist"}]})

    error: str = Field(description="The error class, e.g. ``validation_failed``.")
    reason: str | None = Field(None, description="The specific reason, e.g. "
                               "``unknown_template``; absent for ``not_found``.")
    message: str | None = Field(None, description="Human-readable; never contains input "
                                "values.")
    details: list[ErrorDetail] | None = Field(None, description="Schema failures "
                                              "(``invalid_body``, ``invalid_request``, ...).")


class ApiError(Exception):
    """An error response; ``extra`` fields are merged into the body."""

    def __init__(self, status: int, error: str, reason: str | None = None,
                 message: str | None = None, *, headers: dict[str, str] | None = None,
                 **extra: Any) -> None:
        super().__init__(message or reason or error)
        self.status = status
        self.error = error
        self.reason = reason
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.error}
        if self.reason is not None:
            body["reason"] = self.reason
        if self.message is not None:
            body["message"] = self.message
        body.update(self.extra)
        return body

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def unavailable(reason: str, message: str) -> ApiError:
    """503 with ``Retry-After``: nothing was accepted, the client should retry later."""
    return ApiError(503, "unavailable", reason, message,
                    headers={"Retry-After": str(RETRY_AFTER_S)})


def idempotency_conflict() -> ApiError:
    """409: the ``Idempotency-Key`` was used with another request."""
    return ApiError(409, "idempotency_conflict", "request_mismatch",
                    "this Idempotency-Key was used with a different request")


def rate_limited(reason: str, message: str, wait_s: float) -> ApiError:
    """429 with ``Retry-After`` in whole seconds (rounded up, at least 1)."""
    return ApiError(429, "rate_limited", reason, message,
                    headers={"Retry-After": str(retry_after_s(wait_s))})


def bad_request(reason: str, message: str) -> ApiError:
    return ApiError(400, "bad_request", reason, message)


def forbidden(reason: str, message: str) -> ApiError:
    return ApiError(403, "forbidden", reason, message)


def not_found() -> ApiError:
    return ApiError(404, "not_found")


def unprocessable(reason: str, message: str, **extra: Any) -> ApiError:
    """422 for a well-formed request that cannot be accepted (unknown template, ...)."""
    return ApiError(422, "validation_failed", reason, message, **extra)


def validation_details(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """Pydantic errors as ``[{"loc", "msg", "type"}]``, without echoing input values."""
    return [
        {"loc": [p for p in e.get("loc", ()) if p != "body"], "msg": e.get("msg", ""),
         "type": e.get("type", "")}
        for e in errors
    ]


def invalid_body(exc: ValidationError) -> ApiError:
    return ApiError(422, "validation_failed", "invalid_body",
                    details=validation_details(exc.errors(include_input=False)))


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], data: Any) -> M:
    """``data`` as ``model``; raises the ``422`` :func:`invalid_body` error when it does not
    validate."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid_body(exc) from None


def store_unavailable(exc: BaseException) -> ApiError:
    log.warning("cassandra unavailable: %s", type(exc).__name__)
    return unavailable("cassandra_unavailable", "the message store is unavailable")


def kafka_unavailable(exc: BaseException) -> ApiError:
    log.warning("kafka delivery failed: %s", exc)
    return unavailable("kafka_unavailable", "the message log did not acknowledge the request")


def state_contended(exc: BaseException) -> ApiError:
    log.info("preference state contended: %s", exc)
    return unavailable("preferences_contention",
                       "the recipient's state is changing concurrently; retry")


def allowed_methods(routes: Iterable[Any], path: str) -> list[str]:
    """Every method some route serves at ``path`` (routers included into the app are
    walked), for the ``Allow`` header of a 405."""
    methods: set[str] = set()
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            methods.update(allowed_methods(inner.routes, path))
        elif getattr(route, "methods", None) and route.path_regex.match(path):
            methods.update(route.methods)
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Register the handlers that give every error the JSON shape above."""

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return exc.response()

    async def on_request_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return ApiError(422, "validation_failed", "invalid_request",
                        details=validation_details(exc.errors())).response()

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        codes = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        error = ApiError(exc.status_code, codes.get(exc.status_code, "http_error"))
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(app.routes, request.url.path))
        return JSONResponse(error.body(), status_code=exc.status_code, headers=headers)

    async def on_store(_: Request, exc: Exception) -> JSONResponse:
        return store_unavailable(exc).response()

    async def on_kafka(_: Request, exc: Exception) -> JSONResponse:
        return kafka_unavailable(exc).response()

    async def on_contention(_: Request, exc: Exception) -> JSONResponse:
        return state_contended(exc).response()

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_request_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    for cls in CASSANDRA_DOWN:
        app.add_exception_handler(cls, on_store)
    app.add_exception_handler(DeliveryFailed, on_kafka)
    app.add_exception_handler(StateContention, on_contention)
    app.add_middleware(CatchAll)


class CatchAll:
    """ASGI middleware: an unexpected exception becomes ``500 {"error": "internal"}`` and is
    logged here, without input values (a pydantic error would echo a recipient), instead of
    being re-raised to the server's traceback logger."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            where = f"{scope.get('method')} {scope.get('path')}"
            if isinstance(exc, ValidationError):
                locations = [e.get("loc") for e in exc.errors(include_input=False)]
                log.error("unhandled validation error on %s at %s", where, locations)
            else:
                log.exception("unhandled error on %s", where)
            if started:
                return
            error = ApiError(500, "internal", "unexpected_error", "internal error")
            await error.response()(scope, receive, send)
