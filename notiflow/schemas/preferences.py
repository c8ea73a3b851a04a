"""Recipient preference and suppression state (consent, opt-outs, timezone, quiet hours).

Source of truth: Cassandra ``recipient_preferences``. Every change is also published, whole,
to the compacted topic ``notify.preferences`` (key ``{tenant_id}:{recipient_hash}``), which the
send flows join with messages by recipient.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import time
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import phonenumbers
from phonenumbers import timezone as phone_tz
from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from notiflow.schemas.enums import Category, Channel, PushPlatform
from notiflow.schemas.formats import TOPIC_PATTERN, wall_clock_window, zoned
from notiflow.schemas.messages import (
    SCHEMA_VERSION,
    EmailAddress,
    PhoneNumber,
    PushRecipient,
    TenantId,
    Wire,
)

_PHONE: TypeAdapter[str] = TypeAdapter(PhoneNumber)
_EMAIL: TypeAdapter[str] = TypeAdapter(EmailAddress)


REQUIRED_CATEGORIES: frozenset[Category] = frozenset({Category.OTP, Category.SECURITY})
"""Categories no one can opt out of (a sign-in code, a security alert): an opt-out never
blocks them; a suppression of the address (dead, bounced, STOP) still does."""


class OptOut(Wire):
    """No messages of ``category`` on ``channel``; ``"*"`` matches any (never a category of
    :data:`REQUIRED_CATEGORIES`)."""

    channel: Channel | Literal["*"] = "*"
    category: Category | Literal["*"] = "*"

    def matches(self, channel: Channel, category: Category) -> bool:
        return (category not in REQUIRED_CATEGORIES and self.channel in ("*", channel)
                and self.category in ("*", category))


class OptOutChoice(OptOut):
    """An opt-out as a person or tenant asks for it: of any category but a required one."""

    category: Literal[Category.TRANSACTIONAL, Category.ACCOUNT, Category.MARKETING,
                      "*"] = "*"


def as_choices(opt_outs: Iterable[OptOut]) -> tuple[OptOutChoice, ...]:
    """Stored opt-outs as choices a person may make again: those naming a required
    category (stored before they were refused; they block nothing) are left out."""
    return tuple(OptOutChoice(channel=o.channel, category=o.category) for o in opt_outs
                 if o.category not in REQUIRED_CATEGORIES)


class QuietWindow(Wire):
    """Local wall-clock window; ``start`` inclusive, ``end`` exclusive; may wrap midnight."""

    model_config = ConfigDict(json_schema_extra=wall_clock_window)

    start: time
    end: time

    @field_validator("start", "end")
    @classmethod
    def _wall_clock(cls, v: time) -> time:
        if v.tzinfo is not None:
            raise ValueError("quiet hours are local wall-clock times, without an offset")
        return v


class PreferencesUpdate(Wire):
    """Body of ``PUT /v1/recipients/{id}/preferences`` (replaces the stored preferences)."""

    model_config = ConfigDict(json_schema_extra=zoned)

    timezone: str | None = None
    quiet_hours: QuietWindow | None = None
    opt_outs: tuple[OptOutChoice, ...] = Field(default=(), max_length=64)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str | None) -> str | None:
        return v if v is None else known_zone(v)


def known_zone(value: str) -> str:
    """``value`` when it names an IANA time zone this server knows; ValueError otherwise."""
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown IANA timezone {value!r}") from None
    return value


Suppression = Literal["token_deactivated", "hard_bounce", "unsubscribed", "complaint",
                      "webhook_revoked"]


class PreferenceState(Wire):
    """The whole state of one recipient of one tenant (value of ``notify.preferences``)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    tenant_id: TenantId
    recipient_hash: str
    version: int = Field(ge=0)
    updated_at: AwareDatetime
    timezone: str | None = None
    quiet_hours: QuietWindow | None = None
    opt_outs: tuple[OptOut, ...] = ()
    suppressed: Suppression | None = None
    """Set for a dead address or device token: nothing is sent to it."""
    muted_topics: tuple[str, ...] = ()
    """Topics whose sends skip this recipient (a user's own preferences only)."""

    @property
    def key(self) -> str:
        return state_key(self.tenant_id, self.recipient_hash)

    def blocks(self, channel: Channel, category: Category) -> str | None:
        """The suppression reason for a message, or None when it may be sent."""
        if self.suppressed is not None:
            return self.suppressed
        for o in self.opt_outs:
            if o.matches(channel, category):
                return "opted_out"
        return None


def state_key(tenant_id: str, recipient_hash: str) -> str:
    return f"{tenant_id}:{recipient_hash}"


def combined_state(states: Sequence[PreferenceState | None]) -> PreferenceState | None:
    """One recipient's state from the states stored under each of its hashes, current hash
    first (``redact.recipient_hashes``): timezone, quiet hours and opt-outs of the first
    stored state (a preference write replaces them whole, under the current hash), and the
    first suppression of any of them (a dead address stays dead whichever key recorded
    it). None when none is stored."""
    stored = [s for s in states if s is not None]
    if not stored:
        return None
    first = stored[0]
    suppressed = next((s.suppressed for s in stored if s.suppressed is not None), None)
    if suppressed == first.suppressed:
        return first
    return first.model_copy(update={"suppressed": suppressed})


def address_key(address: str) -> str:
    """The recipient key of an address as written in a send request: E.164 phone (as is),
    email address (normalised, lowercased) or ``<platform>:<device token>``; the same string
    :meth:`SendRequest.recipient_key` yields, so both hash alike. ValueError otherwise."""
    try:
        if "@" in address:
            return _EMAIL.validate_python(address).lower()
        if address.startswith("+"):
            return _PHONE.validate_python(address)
        platform, sep, token = address.partition(":")
        if sep and platform in {p.value for p in PushPlatform}:
            push = PushRecipient(device_token=token, platform=PushPlatform(platform))
            return f"{push.platform.value}:{push.device_token}"
    except ValidationError as exc:
        first = exc.errors(include_input=False)[0]
        raise ValueError(str(first.get("msg", "invalid recipient"))) from None
    raise ValueError("recipient must be an E.164 phone number, an email address or "
                     "<ios|android|web>:<device token>")


class PreferencesView(Wire):
    """Body of ``GET``/``PUT /v1/recipients/{recipient}/preferences``: the stored state with
    the recipient shown masked."""

    recipient: str
    recipient_hash: str
    version: int
    updated_at: AwareDatetime
    timezone: str | None
    quiet_hours: QuietWindow | None
    opt_outs: tuple[OptOut, ...]
    suppressed: Suppression | None

    @classmethod
    def of(cls, state: PreferenceState, masked: str) -> PreferencesView:
        return cls(recipient=masked, recipient_hash=state.recipient_hash,
                   version=state.version, updated_at=state.updated_at,
                   timezone=state.timezone, quiet_hours=state.quiet_hours,
                   opt_outs=state.opt_outs, suppressed=state.suppressed)


class UserPreferencesUpdate(Wire):
    """Body of ``PUT /v1/users/{user_id}/preferences``: what the user does not want, per
    channel and category, on every address of theirs (replaces the stored opt-outs)."""

    opt_outs: tuple[OptOutChoice, ...] = Field(default=(), max_length=64)
    muted_topics: tuple[Annotated[str, Field(pattern=TOPIC_PATTERN, max_length=128)], ...] = (
        Field(default=(), max_length=256, json_schema_extra={"uniqueItems": True}))
    """Topics the user hears nothing from (a send to the topic skips them); each once."""

    @field_validator("muted_topics")
    @classmethod
    def _each_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError("each topic is listed once")
        return tuple(sorted(v))


class UserPreferencesView(Wire):
    """Body of ``GET``/``PUT /v1/users/{user_id}/preferences``: the user's opt-outs, the
    version a send records when it honours them (0: none stored yet), and the categories
    no one can opt out of."""

    user_id: str
    version: int = Field(ge=0)
    updated_at: AwareDatetime | None
    opt_outs: tuple[OptOut, ...]
    muted_topics: tuple[str, ...] = ()
    required: tuple[Category, ...] = tuple(sorted(REQUIRED_CATEGORIES))


class DeviceRegistration(Wire):
    """Body of ``PUT /v1/recipients/{recipient}/devices/{token}``."""

    platform: PushPlatform


class DeviceView(Wire):
    """Body of a successful ``PUT`` or ``GET /v1/recipients/{recipient}/devices/{token}``."""

    recipient: str
    device_token: str
    platform: PushPlatform
    active: bool
    deactivated_reason: str | None = None
    updated_at: AwareDatetime
    suppressed: Suppression | None = None
    """Suppression of the token's own state after the call (None once reactivated)."""


def phone_timezone(number: str) -> str | None:
    """The IANA zone of an E.164 number when its prefix maps to exactly one zone."""
    try:
        zones = phone_tz.time_zones_for_number(phonenumbers.parse(number, None))
    except phonenumbers.NumberParseException:
        return None
    zones = tuple(z for z in zones if z != "Etc/Unknown")
    return zones[0] if len(zones) == 1 else None
