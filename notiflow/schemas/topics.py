"""Topics: named audiences of a tenant's users ("everyone following project X"), managed by
the tenant through ``/v1/topics/{topic}/subscribers``."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field, field_validator

from notiflow.schemas.formats import TOPIC_PATTERN
from notiflow.schemas.messages import Wire
from notiflow.schemas.users import USER_ID_PATTERN

TopicName = Annotated[str, Field(pattern=TOPIC_PATTERN, max_length=128)]
MAX_USERS: Final = 1000
UserId = Annotated[str, Field(pattern=USER_ID_PATTERN, max_length=128)]


class TopicUsers(Wire):
    """Body of ``PUT``/``DELETE /v1/topics/{topic}/subscribers``: up to 1,000 user ids,
    each once."""

    users: tuple[UserId, ...] = Field(min_length=1, max_length=MAX_USERS)

    @field_validator("users")
    @classmethod
    def _each_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError("each user is listed once")
        return v


class Subscribed(Wire):
    """Answer of ``PUT``: how many users now follow the topic from this request, and the
    ids the tenant has no user for (not subscribed)."""

    subscribed: int
    unknown: tuple[str, ...] = ()


class Unsubscribed(Wire):
    unsubscribed: int


class SubscriberPage(Wire):
    """One page of a topic's subscribers; ``next_cursor`` fetches the next (None: the
    last page)."""

    users: tuple[str, ...]
    next_cursor: str | None


class UserTopics(Wire):
    topics: tuple[str, ...]
