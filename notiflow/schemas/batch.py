"""Wire contracts of ``POST /v1/messages:batch`` (docs/api.md): the call's body and its
per-item results."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from notiflow.schemas.enums import Status
from notiflow.schemas.messages import IdempotencyKey, SendRequest, Wire
from notiflow.schemas.user_sends import UserAccepted, UserSendRequest

MAX_ITEMS: Final = 1000


class BatchItem(SendRequest):
    """One item of a batch: a send request with its own optional idempotency key (same
    rules as the ``Idempotency-Key`` header)."""

    idempotency_key: IdempotencyKey | None = None


class BatchUserItem(UserSendRequest):
    """One item of a batch sent to a user, with its own optional idempotency key."""

    idempotency_key: IdempotencyKey | None = None


def _items_rule(schema: dict[str, Any]) -> None:
    schema["properties"]["messages"]["items"] = {
        "anyOf": [{"$ref": "#/components/schemas/BatchItem"},
                  {"$ref": "#/components/schemas/BatchUserItem"}, {}],
        "description": "A `BatchItem` or a `BatchUserItem`. Items are validated one by one: "
                       "an item that does not match gets its own 422 result and the call is "
                       "still answered 200."}


class BatchRequest(BaseModel):
    """Body of ``POST /v1/messages:batch``; other top-level fields are ignored."""

    model_config = ConfigDict(frozen=True, json_schema_extra=_items_rule)

    messages: Annotated[list[Any], Field(min_length=1, max_length=MAX_ITEMS)]


class BatchAccepted(Wire):
    """An item accepted (or the stored answer of its key): the ``202`` body."""

    code: Literal[202]
    message_id: str
    status: Literal[Status.QUEUED, Status.SCHEDULED]
    accepted_at: datetime
    replayed: bool | None = Field(None, description="The item's key was seen before.")


class BatchUserAccepted(UserAccepted):
    """An item sent to a user, accepted (or the stored answer of its key)."""

    code: Literal[202]
    replayed: bool | None = Field(None, description="The item's key was seen before.")


class BatchRefused(BaseModel):
    """An item refused: the status and error body the single endpoint would have answered,
    ``retry_after`` where it would have sent ``Retry-After``."""

    model_config = ConfigDict(frozen=True, extra="allow")

    code: int = Field(ge=400, le=599)
    error: str
    reason: str | None = None
    message: str | None = None
    details: list[dict[str, Any]] | None = None
    retry_after: int | None = Field(None, ge=1)
    replayed: bool | None = None


class BatchResults(Wire):
    """``200`` of ``POST /v1/messages:batch``: one result per item, in order."""

    results: list[BatchAccepted | BatchUserAccepted | BatchRefused]
