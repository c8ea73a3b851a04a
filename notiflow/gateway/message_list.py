"""``GET /v1/messages``: the calling tenant's recent messages, newest first.

Served by ``messages_by_tenant_day`` (one partition per tenant and UTC day) joined with the
current ``messages`` row
(:meth:`~notiflow.adapters.cassandra.listing.MessageListing.recent_messages`). Query
parameters: ``since`` (RFC 3339 with offset; default 24 h ago; not in the future, not
beyond the operational retention), ``limit`` (1-200, default 50),
``status`` (a status name: only messages currently in it), ``cursor`` (the ``next_cursor``
of the previous page). A page may hold fewer than ``limit`` messages and still have a
``next`` (the scan bound was reached); the list ends when ``next`` is null. Invalid
parameters → 422. Recipients are never returned. See ``docs/api.md``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Response
from pydantic import AwareDatetime

from notiflow.adapters.cassandra.listing import Cursor
from notiflow.gateway.auth import RuntimeDep, Tenant
from notiflow.gateway.errors import unprocessable
from notiflow.gateway.openapi import tenant_errors
from notiflow.gateway.runtime import now_ms
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import MessageHead, Wire

router = APIRouter()

DEFAULT_SINCE = timedelta(hours=24)
MAX_LIMIT = 200
PATH = "/v1/messages"


class MessageSummary(MessageHead):
    """One message of the list (no recipient, no variables)."""

    attempt: int | None
    accepted_at: datetime | None
    updated_at: datetime | None


class MessageList(Wire):
    """A page of ``GET /v1/messages``; ``next`` is the URL of the following page."""

    messages: tuple[MessageSummary, ...]
    next_cursor: str | None
    next: str | None


def check_since(since: datetime | None, now: datetime, retention: timedelta) -> datetime:
    """The effective lower bound: ``now - 24 h`` by default; 422 ``invalid_since`` when in
    the future or older than the retention (such rows no longer exist)."""
    if since is None:
        return now - min(DEFAULT_SINCE, retention)
    if since > now:
        raise unprocessable("invalid_since", "since lies in the future")
    if now - since > retention:
        raise unprocessable("invalid_since", f"since lies beyond the retention of operational "
                            f"data ({retention.days} days)")
    return since


@router.get(PATH, response_model=MessageList, responses=tenant_errors(
    422, r422="`invalid_request` (with `details`) for a malformed parameter; not stated by "
              "the schema: `invalid_since` (in the future, or beyond the 30-day retention), "
              "`invalid_cursor` (not a `next_cursor` of this list)."))
async def list_messages(
    tenant: Tenant,
    rt: RuntimeDep,
    since: Annotated[AwareDatetime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
    status: Annotated[Status | None, Query()] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """The caller's messages accepted at or after ``since``, newest first; 200
    ``MessageList``."""
    now = now_ms()
    lower = check_since(since, now, rt.settings.operational_ttl)
    after = None
    if cursor is not None:
        try:
            after = Cursor.decode(cursor)
        except ValueError:
            raise unprocessable("invalid_cursor", "cursor is not a next_cursor of this "
                                "list") from None
    page = await rt.store().listing.recent_messages(tenant.id, lower, limit=limit, now=now,
                                                    status=status, after=after)
    nxt = page.next.encode() if page.next is not None else None
    query = {"since": lower.isoformat(), "limit": limit}
    if status is not None:
        query["status"] = status.value
    body = MessageList(
        messages=tuple(
            MessageSummary(
                message_id=r.message_id, status=r.current(), reason=r.reason,
                channel=r.channel, tier=r.tier, category=r.category,
                template_id=r.template_id, template_version=r.template_version,
                attempt=r.attempt, accepted_at=r.accepted_at, updated_at=r.updated_at)
            for r in page.messages),
        next_cursor=nxt,
        next=f"{PATH}?{urlencode({**query, 'cursor': nxt})}" if nxt else None,
    )
    return Response(body.model_dump_json(), media_type="application/json")
