"""Users: the people a tenant sends to, with their addresses, locale and time zone.

A user is the tenant's own id (``user_id``, the characters of an in-app recipient, so
``inapp:<user_id>`` is the same person's inbox) and a :class:`UserProfile`. The source of
truth is Cassandra's ``users`` table, the profile sealed with the dead letters' key; every
change is published whole to the compacted topic ``notify.users`` as a :class:`UserState`,
which carries no address, only the addresses' recipient hashes (key ``{tenant_id}:{user_id}``).
An erasure deletes the row and publishes a tombstone.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from notiflow.schemas.enums import Channel, PushPlatform
from notiflow.schemas.formats import (
    PROPERTY_NAME_PATTERN,
    user_device_rule,
    user_patch_rules,
    user_rules,
)
from notiflow.schemas.locales import Locale
from notiflow.schemas.messages import (
    SCHEMA_VERSION,
    ChatWebhookUrl,
    EmailAddress,
    PhoneNumber,
    PushRecipient,
    TenantId,
    Wire,
)
from notiflow.schemas.preferences import known_zone

USER_ID_PATTERN: Final = r"^[A-Za-z0-9._@+:-]{1,128}$"
"""A user id: the characters of an in-app recipient's id, 1-128 of them."""
MAX_PROPERTIES_BYTES: Final = 8192
"""The largest ``properties`` object, as compact JSON."""
PROPERTY_NAME: Final = re.compile(PROPERTY_NAME_PATTERN)

UserId = Annotated[str, Field(pattern=USER_ID_PATTERN)]
PropertyValue = str | int | float | bool | None
TimeZone = Annotated[str, Field(max_length=64), AfterValidator(known_zone)]


class UserDevice(Wire):
    """A push device of a user: its platform and token (shape checked per platform)."""

    model_config = ConfigDict(json_schema_extra=user_device_rule)

    platform: PushPlatform
    token: str = Field(min_length=32, max_length=4096)

    @model_validator(mode="after")
    def _shape(self) -> UserDevice:
        PushRecipient(device_token=self.token, platform=self.platform)
        return self

    @property
    def address(self) -> str:
        """``<platform>:<token>``, the recipient key of its push messages."""
        return f"{self.platform.value}:{self.token}"


def _unique(values: tuple[Any, ...], what: str) -> tuple[Any, ...]:
    if len(set(values)) != len(values):
        raise ValueError(f"{what} are listed once each")
    return values


class UserProfile(Wire):
    """Body of ``PUT /v1/users/{user_id}``: everything the platform knows of a user (a field
    left out is cleared)."""

    model_config = ConfigDict(json_schema_extra=user_rules)

    phones: tuple[PhoneNumber, ...] = Field((), max_length=8)
    """E.164 numbers, preferred first."""
    emails: tuple[EmailAddress, ...] = Field((), max_length=8)
    """Email addresses, preferred first (normalised, lower-cased)."""
    devices: tuple[UserDevice, ...] = Field((), max_length=16)
    chat_webhooks: tuple[ChatWebhookUrl, ...] = Field((), max_length=4)
    """Incoming-webhook URLs of the user's team chats (checked like a chat recipient)."""
    in_app: StrictBool = True
    """Whether the user reads an in-app inbox (``inapp:<user_id>``)."""
    locale: Locale | None = None
    timezone: TimeZone | None = None
    properties: dict[str, PropertyValue] = Field(default_factory=dict, max_length=64)
    """The tenant's own attributes of the user (names 1-64 word characters; values
    strings, numbers, booleans or null; at most 8 KiB as JSON), for templates."""

    @field_validator("emails")
    @classmethod
    def _emails(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _unique(tuple(e.lower() for e in v), "email addresses")

    @field_validator("phones")
    @classmethod
    def _phones(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _unique(v, "phone numbers")

    @field_validator("devices")
    @classmethod
    def _devices(cls, v: tuple[UserDevice, ...]) -> tuple[UserDevice, ...]:
        _unique(tuple(d.address for d in v), "device tokens")
        return v

    @field_validator("chat_webhooks")
    @classmethod
    def _chats(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _unique(v, "chat webhooks")

    @field_validator("properties")
    @classmethod
    def _properties(cls, v: dict[str, PropertyValue]) -> dict[str, PropertyValue]:
        bad = [name for name in v if not PROPERTY_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"property names are 1-64 word characters: {bad[0][:80]!r}")
        if len(json.dumps(v, separators=(",", ":"))) > MAX_PROPERTIES_BYTES:
            raise ValueError(f"properties take at most {MAX_PROPERTIES_BYTES} bytes as JSON")
        return v

    def addresses(self) -> dict[Channel, tuple[str, ...]]:
        """The recipient keys of each channel the user can be reached on, preferred first."""
        found = {Channel.SMS: self.phones, Channel.EMAIL: self.emails,
                 Channel.PUSH: tuple(d.address for d in self.devices),
                 Channel.CHAT: self.chat_webhooks}
        return {channel: keys for channel, keys in found.items() if keys}


class UserPatch(Wire):
    """Body of ``PATCH /v1/users/{user_id}`` (JSON merge patch, RFC 7396): a field present
    replaces the stored one, ``null`` clears it, a field left out stays; ``properties``
    merges name by name, a ``null`` value removing that name."""

    model_config = ConfigDict(json_schema_extra=user_patch_rules)

    phones: tuple[PhoneNumber, ...] | None = Field(None, max_length=8)
    emails: tuple[EmailAddress, ...] | None = Field(None, max_length=8)
    devices: tuple[UserDevice, ...] | None = Field(None, max_length=16)
    chat_webhooks: tuple[ChatWebhookUrl, ...] | None = Field(None, max_length=4)
    in_app: StrictBool | None = None
    locale: Locale | None = None
    timezone: TimeZone | None = None
    properties: dict[str, PropertyValue] | None = Field(None, max_length=64)

    def applied_to(self, current: UserProfile) -> UserProfile:
        """The profile after this patch; ValueError when the result is not a valid profile
        (e.g. its properties grew past the limit)."""
        fields = profile_fields(current)
        for name in self.model_fields_set:
            value = getattr(self, name)
            if name == "properties":
                merged = {**current.properties, **(value or {})}
                fields[name] = {k: v for k, v in merged.items()
                                if not (value and k in value and value[k] is None)}
            elif value is None:
                fields[name] = UserProfile.model_fields[name].get_default(
                    call_default_factory=True)
            else:
                fields[name] = value
        return UserProfile.model_validate(fields)


class UserView(UserProfile):
    """Body of ``GET``/``PUT``/``PATCH /v1/users/{user_id}``: the stored user."""

    user_id: UserId
    version: int = Field(ge=1)
    """Starts at 1 and grows by one with every change."""
    created_at: AwareDatetime
    updated_at: AwareDatetime

    @classmethod
    def of(cls, profile: UserProfile, user_id: str, version: int, created_at: datetime,
           updated_at: datetime) -> UserView:
        return cls(**profile_fields(profile), user_id=user_id, version=version,
                   created_at=created_at, updated_at=updated_at)

    def profile(self) -> UserProfile:
        return UserProfile(**profile_fields(self))


def next_version(current: UserView | None, wanted: UserProfile, user_id: str,
                 now: datetime) -> UserView:
    """The user a write of ``wanted`` over ``current`` stores: ``version + 1`` (1 for a new
    user), the creation time kept, ``updated_at`` never going back."""
    if current is None:
        return UserView.of(wanted, user_id, 1, now, now)
    return UserView.of(wanted, user_id, current.version + 1, current.created_at,
                       max(now, current.updated_at))


def profile_fields(profile: UserProfile) -> dict[str, Any]:
    """The fields of a profile (of a view too) as constructor arguments."""
    return {name: getattr(profile, name) for name in UserProfile.model_fields}


class UserState(Wire):
    """Value of ``notify.users``: what the flows know of a user. No address appears: each
    channel lists the recipient hashes of its addresses, preferred first."""

    schema_version: Literal[1] = SCHEMA_VERSION
    tenant_id: TenantId
    user_id: UserId
    version: int = Field(ge=1)
    updated_at: AwareDatetime
    locale: str | None = None
    timezone: str | None = None
    in_app: bool = True
    channels: dict[Channel, tuple[str, ...]] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return user_key(self.tenant_id, self.user_id)


def user_key(tenant_id: str, user_id: str) -> str:
    """The Kafka key of a user's records on ``notify.users``."""
    return f"{tenant_id}:{user_id}"
