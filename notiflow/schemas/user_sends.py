"""Sending to a user: ``POST /v1/messages`` with ``recipient: "user:<id>"``.

The request names the channels the tenant allows, in its order of preference, each with its
template (a template has one channel). The API chooses the channels and addresses
(:func:`notiflow.user_choice.choose`) and accepts one message per chosen address; the
decision (what was sent where, and why every other channel or address was skipped) is
stored under the request's own ``message_id`` and shown by ``GET /v1/messages/{id}``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    HttpUrl,
    RootModel,
    field_validator,
    model_validator,
)

from notiflow.schemas.enums import Category, Channel, PushPlatform, Status, Tier
from notiflow.schemas.formats import channel_option_rules, user_send_rules
from notiflow.schemas.locales import Locale
from notiflow.schemas.messages import (
    ChannelSender,
    PushRecipient,
    Recipient,
    SendRequest,
    TemplateId,
    Variables,
    Wire,
    schedule_bounds,
)
from notiflow.schemas.users import USER_ID_PATTERN

USER_PREFIX: Final = "user:"
USER_RECIPIENT_PATTERN: Final = "^user:" + USER_ID_PATTERN[1:]
"""``user:`` and a user id (:data:`~notiflow.schemas.users.USER_ID_PATTERN`)."""

Deliver = Literal["first", "every"]
"""``first``: the first channel, in the request's order, with an address that may receive the
message; ``every``: every such channel."""
SkipReason = Literal[
    "no_address", "in_app_off", "opted_out", "not_needed", "recipient_not_served",
    "inbox_not_configured", "token_deactivated", "hard_bounce", "unsubscribed", "complaint",
    "webhook_revoked", "topic_muted"]
"""Why a channel or an address got nothing: the user has no address on it, reads no inbox,
opted out of the category on it, a channel earlier in the order was chosen (``first``), the
platform cannot serve the address, the address's suppression, or (a send to a topic) the
user muted the topic."""


def is_user_recipient(data: Any) -> bool:
    """Whether a request body names a user as its recipient (``"user:..."``)."""
    if not isinstance(data, dict):
        return False
    recipient = data.get("recipient")
    return isinstance(recipient, str) and recipient.startswith(USER_PREFIX)


class ChannelOption(Wire):
    """A channel the message may go out on, with the template (of that channel) it uses."""

    model_config = ConfigDict(json_schema_extra=channel_option_rules)

    channel: Channel
    template_id: TemplateId
    template_version: int = Field(ge=1, le=1_000_000)
    sender: ChannelSender = None


def distinct_channels(v: tuple[ChannelOption, ...]) -> tuple[ChannelOption, ...]:
    """``channels`` with each channel once (ValueError otherwise)."""
    seen = [o.channel for o in v]
    if len(set(seen)) != len(seen):
        raise ValueError("each channel is listed once")
    return v


class UserSendRequest(Wire):
    """Body of ``POST /v1/messages`` for a user (``recipient: "user:<id>"``)."""

    model_config = ConfigDict(json_schema_extra=user_send_rules)

    recipient: Annotated[str, Field(pattern=USER_RECIPIENT_PATTERN, max_length=133)]
    tier: Tier
    channels: tuple[ChannelOption, ...] = Field(min_length=1, max_length=5)
    """The channels allowed, the tenant's preferred first, each at most once."""
    deliver: Deliver = "first"
    variables: Variables = Field(default_factory=dict)
    category: Category = Category.TRANSACTIONAL
    expires_at: AwareDatetime | None = None
    scheduled_at: AwareDatetime | None = None
    ordering_key: str | None = Field(None, min_length=1, max_length=256)
    status_webhook: HttpUrl | None = None
    locale: Locale | None = None
    """The template variant's locale; None: the user's own (``locale`` of their profile)."""

    _channels = field_validator("channels")(distinct_channels)

    @model_validator(mode="after")
    def _schedule_bounds(self) -> UserSendRequest:
        schedule_bounds(self.tier, self.scheduled_at, self.expires_at)
        return self

    @property
    def user_id(self) -> str:
        return self.recipient.removeprefix(USER_PREFIX)

    def _common(self) -> dict[str, Any]:
        return {"tier": self.tier, "variables": self.variables, "category": self.category,
                "expires_at": self.expires_at, "scheduled_at": self.scheduled_at,
                "ordering_key": self.ordering_key, "status_webhook": self.status_webhook}

    def leg(self, option: ChannelOption, address: str,
            user_locale: str | None = None) -> SendRequest:
        """The single send request of ``option`` to ``address`` (a recipient key:
        ``<platform>:<token>`` for push, ``inapp:<user id>`` for the inbox), in this
        request's locale, else ``user_locale``."""
        recipient: Recipient = address
        if option.channel is Channel.PUSH:
            platform, _, token = address.partition(":")
            recipient = PushRecipient(device_token=token, platform=PushPlatform(platform))
        return SendRequest.model_validate({
            **self._common(), "channel": option.channel, "recipient": recipient,
            "template_id": option.template_id, "template_version": option.template_version,
            "sender": option.sender, "locale": self.locale or user_locale})


class Pick(Wire):
    """An address a message goes to: the channel, the address's place in the user's list of
    that channel, and the version of its preferences honoured (0: none stored)."""

    channel: Channel
    index: int = Field(ge=0)
    preferences_version: int = Field(ge=0)


class Skip(Wire):
    """A channel (``index`` None) or one address of it that got nothing, and why."""

    channel: Channel
    index: int | None = Field(None, ge=0)
    reason: SkipReason


class Decision(Wire):
    """Where a message to a user goes and what was left out, in the request's order, and
    the version of the user's own preferences it honoured (0: none stored)."""

    picks: tuple[Pick, ...] = ()
    skipped: tuple[Skip, ...] = ()
    user_preferences_version: int = Field(0, ge=0)


class LegView(Wire):
    """One message of a user send: its channel, masked address and ``message_id``."""

    channel: Channel
    address: str
    message_id: str
    status: Status | None = None
    """The message's current status (``GET`` only)."""


class UserAccepted(Wire):
    """``202`` body of ``POST /v1/messages`` for a user: the request's own ``message_id``,
    one message per chosen address (``messages``) and what was skipped. ``SUPPRESSED``:
    no channel may receive it (``skipped`` says why); nothing is sent."""

    message_id: str
    status: Literal[Status.QUEUED, Status.SCHEDULED, Status.SUPPRESSED]
    accepted_at: datetime
    deliver: Deliver
    messages: tuple[LegView, ...]
    skipped: tuple[Skip, ...]


class UserMessageView(Wire):
    """``GET /v1/messages/{id}`` of a user send: the decision and each message's status.
    ``status``: the furthest status of its messages, ``SUPPRESSED`` when it has none."""

    message_id: str
    recipient: Literal["user"] = "user"
    """A user send (the user's id is not kept: an erasure leaves only the decision)."""
    status: Status
    tier: Tier
    category: Category
    deliver: Deliver
    accepted_at: datetime
    messages: tuple[LegView, ...]
    skipped: tuple[Skip, ...]
    user_preferences_version: int = Field(0, ge=0)
    """The version of the user's preferences the decision honoured (0: none stored)."""


class UserSendRecord(Wire):
    """A user send as stored (Cassandra ``user_sends``): the decision, each chosen address
    masked with the ``message_id`` of its message, and the request's hash (a replay of its
    ``Idempotency-Key`` with another body is a conflict)."""

    message_id: str
    tenant_id: str
    request_hash: str
    tier: Tier
    category: Category
    deliver: Deliver
    accepted_at: AwareDatetime
    status: Literal[Status.QUEUED, Status.SCHEDULED, Status.SUPPRESSED]
    picks: tuple[Pick, ...]
    messages: tuple[LegView, ...]
    skipped: tuple[Skip, ...]
    user_preferences_version: int = Field(0, ge=0)

    def accepted(self) -> UserAccepted:
        return UserAccepted(message_id=self.message_id, status=self.status,
                            accepted_at=self.accepted_at, deliver=self.deliver,
                            messages=self.messages, skipped=self.skipped)


class MessageRequest(RootModel[SendRequest | UserSendRequest]):
    """Body of ``POST /v1/messages``: one message to an address, or a send to a user."""
