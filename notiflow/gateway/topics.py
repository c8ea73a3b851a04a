"""Topics (``docs/users.md``, "Topics"): ``PUT``/``DELETE /v1/topics/{topic}/subscribers``
add and remove users of the caller's tenant, ``GET`` pages through them, and
``GET /v1/users/{user_id}/topics`` lists what a user follows. Every write is idempotent and
stored (Cassandra ``topic_subscribers`` and ``user_topics``) before the answer; an erasure
of the user removes their subscriptions."""

from __future__ import annotations

import asyncio
import base64
import re
from datetime import UTC, datetime
from typing import Annotated, Final

from fastapi import APIRouter, Path, Query, Request, Response

from notiflow.adapters.ports import TOPIC_BUCKETS, TopicSubscriptions
from notiflow.gateway.auth import RuntimeDep, Tenant, read_model
from notiflow.gateway.errors import ApiError, not_found
from notiflow.gateway.openapi import json_body, tenant_errors
from notiflow.gateway.runtime import Runtime
from notiflow.gateway.users import UserIdPath, checked_user_id
from notiflow.schemas.messages import Wire
from notiflow.schemas.topics import (
    TOPIC_PATTERN,
    Subscribed,
    SubscriberPage,
    TopicUsers,
    Unsubscribed,
    UserTopics,
)

router = APIRouter()
JSON: Final = "application/json"
TOPIC: Final = re.compile(TOPIC_PATTERN)
LOOKUPS: Final = 32
"""Users looked up at once while subscribing."""
TopicPath = Annotated[str, Path(description="The tenant's own name of the topic.",
                                json_schema_extra={"pattern": TOPIC_PATTERN,
                                                   "maxLength": 128})]
EXAMPLE: Final = {"two": {"users": ["user-42", "user-43"]}}


def checked_topic(topic: str) -> str:
    if not TOPIC.fullmatch(topic):
        raise ApiError(422, "validation_failed", "invalid_topic",
                       details=[{"loc": ["path", "topic"], "type": "value_error",
                                 "msg": "a topic is 1-128 letters, digits and ._:- "
                                        "(starting with a letter or digit)"}])
    return topic


def _json(model: Wire) -> Response:
    return Response(model.model_dump_json(), media_type=JSON)


async def known_users(rt: Runtime, tenant_id: str, user_ids: tuple[str, ...]) -> set[str]:
    """Those of ``user_ids`` the tenant has a user for."""
    gate = asyncio.Semaphore(LOOKUPS)
    users = rt.users()

    async def exists(uid: str) -> bool:
        async with gate:
            return await users.get(tenant_id, uid) is not None

    found = await asyncio.gather(*(exists(u) for u in user_ids))
    return {u for u, ok in zip(user_ids, found, strict=True) if ok}


def topics(rt: Runtime) -> TopicSubscriptions:
    return rt.store().topics


@router.put("/v1/topics/{topic}/subscribers", response_model=Subscribed,
            responses=tenant_errors(400, 413, 422, r422="`invalid_body`, `invalid_topic`."),
            openapi_extra=json_body(TopicUsers, "Users to add to the topic.", EXAMPLE))
async def subscribe_users(topic: TopicPath, request: Request, tenant: Tenant,
                          rt: RuntimeDep) -> Response:
    """Add users to a topic (again: no change); ids the tenant has no user for are
    answered in ``unknown`` and not added."""
    checked_topic(topic)
    body = await read_model(request, TopicUsers)
    known = await known_users(rt, tenant.id, body.users)
    ordered = [u for u in body.users if u in known]
    await topics(rt).subscribe(tenant.id, topic, ordered, datetime.now(UTC))
    return _json(Subscribed(subscribed=len(ordered),
                            unknown=tuple(u for u in body.users if u not in known)))


@router.delete("/v1/topics/{topic}/subscribers", response_model=Unsubscribed,
               responses=tenant_errors(400, 413, 422, r422="`invalid_body`, `invalid_topic`."),
               openapi_extra=json_body(TopicUsers, "Users to remove from the topic.",
                                       EXAMPLE))
async def unsubscribe_users(topic: TopicPath, request: Request, tenant: Tenant,
                            rt: RuntimeDep) -> Response:
    """Remove users from a topic (one that did not follow it: no change)."""
    checked_topic(topic)
    body = await read_model(request, TopicUsers)
    await topics(rt).unsubscribe(tenant.id, topic, body.users)
    return _json(Unsubscribed(unsubscribed=len(body.users)))


def _cursor(bucket: int, after: str) -> str:
    return base64.urlsafe_b64encode(f"{bucket}:{after}".encode()).decode().rstrip("=")


def _position(cursor: str | None) -> tuple[int, str | None]:
    if not cursor:
        return 0, None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        bucket, _, after = text.partition(":")
        if not 0 <= int(bucket) < TOPIC_BUCKETS:
            raise ValueError(bucket)
        return int(bucket), after
    except ValueError:
        raise ApiError(422, "validation_failed", "invalid_cursor",
                       details=[{"loc": ["query", "cursor"], "type": "value_error",
                                 "msg": "not a cursor this API answered"}]) from None


@router.get("/v1/topics/{topic}/subscribers", response_model=SubscriberPage,
            responses=tenant_errors(422, r422="`invalid_topic`, `invalid_cursor`."))
async def list_subscribers(
        topic: TopicPath, tenant: Tenant, rt: RuntimeDep,
        cursor: Annotated[str | None, Query(max_length=400)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Response:
    """A page of the topic's subscribers (in no meaningful order); follow ``next_cursor``."""
    checked_topic(topic)
    bucket, after = _position(cursor)
    users: list[str] = []
    store = topics(rt)
    while bucket < TOPIC_BUCKETS and len(users) < limit:
        got = await store.subscribers(tenant.id, topic, bucket, after, limit - len(users))
        users += got
        if len(users) < limit:
            bucket, after = bucket + 1, None
    more = bucket < TOPIC_BUCKETS and bool(users)
    return _json(SubscriberPage(users=tuple(users),
                                next_cursor=_cursor(bucket, users[-1]) if more else None))


@router.get("/v1/users/{user_id}/topics", response_model=UserTopics,
            responses=tenant_errors(404, 422, r422="`invalid_user_id`."))
async def list_user_topics(user_id: UserIdPath, tenant: Tenant, rt: RuntimeDep) -> Response:
    """The topics a user follows; ``404`` when the tenant has no such user."""
    if await rt.users().get(tenant.id, checked_user_id(user_id)) is None:
        raise not_found()
    return _json(UserTopics(topics=tuple(await topics(rt).topics_of(tenant.id, user_id))))
