"""Sending to a topic: ``POST /v1/topics/{topic}/messages`` (docs/users.md, "Topics").

A topic send is a campaign whose rows are the topic's subscribers. When an expander starts
it, it writes the user ids that follow the topic at that moment to a JSON Lines snapshot in
the tenant's manifest area (one ``{"user_id": ...}`` per line), checkpoints, and expands the
snapshot like a manifest: each row is resolved to the user's addresses as a send to
``user:<id>`` is (:func:`notiflow.user_resolution.resolve`), one message per chosen address.
Pacing, P0 yielding, quota, pause, cancel and progress are the campaign's.

Message ids: row ``n``'s message on channel ``c`` to the user's address ``i`` is
:func:`~notiflow.schemas.campaigns.row_leg_message_id`, so a re-expanded row makes the same
messages and the campaign's funnel counts the row.
"""

from __future__ import annotations

from typing import Annotated

import orjson
from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    HttpUrl,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from notiflow.schemas.campaigns import (
    CAMPAIGN_TIERS,
    CampaignRequest,
    ColumnMapping,
    LocalWindow,
)
from notiflow.schemas.enums import Category, Tier
from notiflow.schemas.formats import HTTP_URL, topic_send_rules
from notiflow.schemas.messages import Variables, Wire
from notiflow.schemas.topics import TOPIC_PATTERN
from notiflow.schemas.user_sends import ChannelOption, Deliver, distinct_channels
from notiflow.schemas.users import TimeZone

MEMBER_COLUMN = "user_id"
"""The snapshot's one column."""


class TopicAudience(Wire):
    """Who a topic campaign's rows are and what each gets: the topic, the channels allowed
    (the tenant's preferred first), the delivery mode and the variables every message
    shares."""

    topic: str = Field(pattern=TOPIC_PATTERN, max_length=128)
    channels: tuple[ChannelOption, ...] = Field(min_length=1, max_length=5)
    deliver: Deliver = "first"
    variables: Variables = Field(default_factory=dict)
    link: bool = False
    """Whether each message gets the user's preference page link as ``preferences_url``
    (a template reads it and the variables do not set it)."""

    _channels = field_validator("channels")(distinct_channels)


class TopicCampaign(CampaignRequest):
    """The stored request of a topic send: a campaign over the snapshot ``manifest`` (column
    ``user_id``) with its ``audience``; ``channel`` and the template are the first channel
    option's."""

    audience: TopicAudience

    @model_validator(mode="after")
    def _shape(self) -> TopicCampaign:
        if self.tier not in CAMPAIGN_TIERS:
            raise ValueError("tier: topic sends are P2 or P3")
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")
        return self


class TopicSendRequest(Wire):
    """Body of ``POST /v1/topics/{topic}/messages``: one message (per chosen channel) to
    every user who follows the topic when the send starts."""

    model_config = ConfigDict(json_schema_extra=topic_send_rules)

    name: str | None = Field(None, min_length=1, max_length=200)
    """None: ``topic <topic>``."""
    tier: Tier = Tier.P3
    category: Category = Category.MARKETING
    channels: tuple[ChannelOption, ...] = Field(min_length=1, max_length=5)
    """The channels allowed, the tenant's preferred first, each at most once."""
    deliver: Deliver = "first"
    variables: Variables = Field(default_factory=dict)
    starts_at: AwareDatetime | None = None
    """None: now."""
    ends_at: AwareDatetime | None = None
    """None: ``campaigns.default_duration`` after the start."""
    window: LocalWindow | None = None
    timezone: TimeZone | None = None
    """Zone of a user whose profile has none; None: the tenant's."""
    max_rate: float | None = Field(None, gt=0, le=100_000)
    quota: int | None = Field(None, ge=1, le=1_000_000_000)
    webhook: Annotated[HttpUrl | None,
                       WithJsonSchema({"anyOf": [HTTP_URL, {"type": "null"}]})] = None

    _channels = field_validator("channels")(distinct_channels)

    @model_validator(mode="after")
    def _tier(self) -> TopicSendRequest:
        if self.tier not in CAMPAIGN_TIERS:
            raise ValueError("tier: topic sends are P2 or P3")
        return self

    def campaign(self, topic: str, snapshot: str, link: bool = False) -> TopicCampaign:
        """The stored request of this send to ``topic`` over the snapshot URI ``snapshot``
        (raises ``ValueError`` as a campaign request does); ``link``: see
        :attr:`TopicAudience.link`."""
        first = self.channels[0]
        return TopicCampaign.model_validate({
            "name": self.name or f"topic {topic}", "channel": first.channel,
            "tier": self.tier, "category": self.category, "template_id": first.template_id,
            "template_version": first.template_version, "manifest": snapshot,
            "format": "jsonl", "mapping": ColumnMapping(recipient=MEMBER_COLUMN),
            "starts_at": self.starts_at, "ends_at": self.ends_at, "window": self.window,
            "timezone": self.timezone, "max_rate": self.max_rate, "quota": self.quota,
            "webhook": self.webhook, "sender": first.sender,
            "audience": TopicAudience(topic=topic, channels=self.channels,
                                      deliver=self.deliver, variables=self.variables,
                                      link=link)})


def campaign_request(spec: str | bytes) -> CampaignRequest:
    """A stored campaign request: a :class:`TopicCampaign` when it names an audience."""
    data = orjson.loads(spec)
    if isinstance(data, dict) and "audience" in data:
        return TopicCampaign.model_validate(data)
    return CampaignRequest.model_validate(data)
