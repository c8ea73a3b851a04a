"""Users of a tenant (scoped by the bearer token): ``PUT``/``PATCH``/``GET``/``DELETE
/v1/users/{user_id}`` and ``POST /v1/users:batch`` for imports.

A change is written to Cassandra (a compare-and-set on ``version``), then published to
``notify.users``, then answered: a ``200``/``201`` means any reader of Cassandra already
sees it. ``DELETE`` erases the user (``adapters/user_directory.py``). See ``docs/users.md``.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Path, Request, Response
from pydantic import Field, ValidationError

from notiflow.adapters.kafka_io import DeliveryFailed
from notiflow.adapters.outages import CASSANDRA_DOWN
from notiflow.adapters.ports import UserContention
from notiflow.audit import Action, AuditEvent
from notiflow.gateway.auth import RuntimeDep, Tenant, actor_of, read_json_object, read_model
from notiflow.gateway.batch import MAX_BATCH_BYTES
from notiflow.gateway.egress_check import check_webhook_url
from notiflow.gateway.errors import ApiError, invalid_body, not_found, unavailable, validated
from notiflow.gateway.openapi import json_body, link, success, tenant_errors
from notiflow.gateway.runtime import Runtime
from notiflow.redact import recipient_hash
from notiflow.schemas.messages import Wire
from notiflow.schemas.users import (
    USER_ID_PATTERN,
    UserPatch,
    UserProfile,
    UserView,
    profile_fields,
)

router = APIRouter()

JSON = "application/json"
MAX_BATCH: Final = 1000
USER_ID: Final = re.compile(USER_ID_PATTERN)
NOT_STORED: Final[tuple[type[Exception], ...]] = (*CASSANDRA_DOWN, DeliveryFailed)
"""What leaves one user of a batch unstored, answered ``503`` for that user alone."""
UserIdPath = Annotated[str, Path(description="The tenant's own id of the user.",
                                 json_schema_extra={"pattern": USER_ID_PATTERN,
                                                    "maxLength": 128})]
USER_LINKS: Final = {"GetUser": link("get_user", "The user just written.",
                                     user_id="$request.path.user_id")}
CHANGE_ERRORS: Final = dict(
    r422="`invalid_body` (the body does not validate: `details` names the fields), "
         "`invalid_user_id`; `webhook_url_not_allowed` (a chat webhook the egress rules "
         "refuse).",
    r503="`users_contention` (the user is changing concurrently; retry), "
         "`kafka_unavailable` (the change is stored; retry to publish it), "
         "`users_unavailable`.")
EXAMPLE: Final = {"ana": {"phones": ["+33612345678"], "emails": ["ana@example.com"],
                          "devices": [{"platform": "ios", "token": "a" * 64}],
                          "locale": "fr-FR", "timezone": "Europe/Paris",
                          "properties": {"first_name": "Ana", "plan": "pro"}}}


def checked_user_id(user_id: str) -> str:
    """``422 invalid_user_id`` for an id outside :data:`USER_ID_PATTERN`."""
    if not USER_ID.fullmatch(user_id):
        raise ApiError(422, "validation_failed", "invalid_user_id",
                       details=[{"loc": ["path", "user_id"], "type": "value_error",
                                 "msg": "a user id is 1-128 letters, digits and ._@+:-"}])
    return user_id


def _view(user: UserView, status: int = 200) -> Response:
    return Response(user.model_dump_json(), status_code=status, media_type=JSON)


async def _chat_webhooks_allowed(rt: Runtime, urls: tuple[str, ...] | None) -> None:
    for i, url in enumerate(urls or ()):
        await check_webhook_url(rt, url, f"chat_webhooks[{i}]")


async def _contended(call: Any) -> Any:
    try:
        return await call
    except UserContention:
        raise unavailable("users_contention",
                          "the user is changing concurrently; retry") from None


@router.put(
    "/v1/users/{user_id}", response_model=UserView,
    responses={**success(200, "The user, replaced.", links=USER_LINKS),
               **success(201, "A new user.", links=USER_LINKS, model=UserView),
               **tenant_errors(400, 413, 422, **CHANGE_ERRORS)},
    openapi_extra=json_body(UserProfile, "The whole user: a field left out is cleared.",
                            EXAMPLE))
async def put_user(user_id: UserIdPath, request: Request, tenant: Tenant,
                   rt: RuntimeDep) -> Response:
    """Create or replace a user; ``201`` when new, ``200`` otherwise, with the stored
    user (``version`` 1 when new, one more with each change)."""
    checked_user_id(user_id)
    profile = await read_model(request, UserProfile)
    await _chat_webhooks_allowed(rt, profile.chat_webhooks)
    user, created = await _contended(rt.users().put(tenant.id, user_id, profile))
    return _view(user, 201 if created else 200)


@router.patch(
    "/v1/users/{user_id}", response_model=UserView,
    responses={**success(200, "The user after the patch.", links=USER_LINKS),
               **tenant_errors(400, 404, 413, 422, **CHANGE_ERRORS)},
    openapi_extra=json_body(UserPatch, "A JSON merge patch (RFC 7396) of the user.",
                            {"locale": {"locale": "fr-CA"}}))
async def patch_user(user_id: UserIdPath, request: Request, tenant: Tenant,
                     rt: RuntimeDep) -> Response:
    """Change some fields of a user: a field present replaces the stored one, ``null``
    clears it, ``properties`` merge name by name; ``404`` when there is no such user."""
    checked_user_id(user_id)
    patch = await read_model(request, UserPatch)
    await _chat_webhooks_allowed(rt, patch.chat_webhooks)
    try:
        user = await _contended(rt.users().patch(tenant.id, user_id, patch))
    except ValidationError as exc:
        raise invalid_body(exc) from None
    if user is None:
        raise not_found()
    return _view(user)


@router.get("/v1/users/{user_id}", response_model=UserView,
            responses=tenant_errors(404, 422, r422="`invalid_user_id`."))
async def get_user(user_id: UserIdPath, tenant: Tenant, rt: RuntimeDep) -> Response:
    """The stored user; ``404`` when the tenant has no such user."""
    checked_user_id(user_id)
    user = await rt.users().get(tenant.id, user_id)
    if user is None:
        raise not_found()
    return _view(user)


@router.delete("/v1/users/{user_id}", status_code=204,
               responses={204: {"description": "Erased."},
                          **tenant_errors(404, 422, r422="`invalid_user_id`.",
                                          r503=CHANGE_ERRORS["r503"])})
async def delete_user(user_id: UserIdPath, request: Request, tenant: Tenant,
                      rt: RuntimeDep) -> Response:
    """Erase a user: their addresses' preferences (a suppression stays, under its hash),
    the devices registered under their phones and emails, their inbox, then the user;
    ``404`` when there is no such user. Repeat a call that failed: each step is
    idempotent."""
    checked_user_id(user_id)
    erased = await _contended(rt.users().erase(tenant.id, user_id))
    if not erased:
        raise not_found()
    rt.auditor.record(AuditEvent(
        datetime.now(UTC), Action.USER_ERASE, actor_of(request), tenant.id,
        f"user:{recipient_hash(tenant.id, 'user:' + user_id)}", {}))
    return Response(status_code=204)


class BatchUser(UserProfile):
    """One user of a ``POST /v1/users:batch``: its id and its whole profile."""

    user_id: str = Field(pattern=USER_ID_PATTERN, max_length=128)


class UserBatch(Wire):
    """Body of ``POST /v1/users:batch``: up to 1,000 users, each created or replaced."""

    users: tuple[dict[str, Any], ...] = Field(min_length=1, max_length=MAX_BATCH)


class BatchOutcome(Wire):
    user_id: str | None
    status: int
    """201 created, 200 replaced, 422 refused (``reason``), 503 not stored (retry it)."""
    reason: str | None = None
    version: int | None = None


class BatchResult(Wire):
    """Body of a ``POST /v1/users:batch`` answer: one outcome per user, in order."""

    results: tuple[BatchOutcome, ...]


@router.post(
    "/v1/users:batch", response_model=BatchResult,
    responses=tenant_errors(400, 413, 422, r413="Bodies are limited to 8 MiB.",
                            r422="`invalid_body`: not an object with `users`, a list of "
                                 "1-1,000 objects."),
    openapi_extra=json_body(UserBatch, "Users to create or replace, each checked alone.",
                            {"two": {"users": [{"user_id": "u-1", **EXAMPLE["ana"]},
                                               {"user_id": "u-2", "emails": ["b@example.com"]}]}},
                            refers_to=(BatchUser,)))
async def put_users(request: Request, tenant: Tenant, rt: RuntimeDep) -> Response:
    """Create or replace many users (an import): each is validated and stored on its own,
    and answered in ``results`` (``200`` overall once every user has an outcome)."""
    batch = validated(UserBatch, await read_json_object(request, MAX_BATCH_BYTES))
    users = rt.users()
    gate = asyncio.Semaphore(32)

    async def one(item: dict[str, Any]) -> BatchOutcome:
        uid = item.get("user_id") if isinstance(item.get("user_id"), str) else None
        try:
            parsed = BatchUser.model_validate(item)
        except ValidationError as exc:
            first = exc.errors(include_input=False, include_url=False)[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return BatchOutcome(user_id=uid, status=422,
                                reason=f"invalid_body: {where}: {first.get('msg')}"[:300])
        profile = UserProfile(**profile_fields(parsed))
        async with gate:
            try:
                await _chat_webhooks_allowed(rt, profile.chat_webhooks)
                user, created = await users.put(tenant.id, parsed.user_id, profile)
            except ApiError as exc:
                return BatchOutcome(user_id=uid, status=exc.status, reason=exc.reason)
            except UserContention:
                return BatchOutcome(user_id=uid, status=503, reason="users_contention")
            except NOT_STORED:
                return BatchOutcome(user_id=uid, status=503, reason="unavailable")
        return BatchOutcome(user_id=uid, status=201 if created else 200, version=user.version)

    results = await asyncio.gather(*(one(item) for item in batch.users))
    return Response(BatchResult(results=tuple(results)).model_dump_json(), media_type=JSON)
