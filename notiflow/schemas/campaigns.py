"""Wire contracts of campaigns: ``POST /v1/campaigns`` and the views of
``GET /v1/campaigns[/{id}]`` (docs/api.md, "Campaigns").

A campaign sends one template to every row of a recipient manifest (CSV or JSON Lines in
object storage). Row ``n`` (1-based, header excluded) becomes message
:func:`row_message_id` ``(keys, campaign, n)``, ``{campaign}_{n}_{tag}``: expanding a row twice
(a crash, a replay) makes one message, any stage holding the correlation keys can tell a
campaign's message and its row from the id alone (:func:`parse_row_message_id`), and nobody
without the keys can name a row's message, so a record that merely looks like a campaign's is
never counted in its funnel nor stopped by its cancel.
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AwareDatetime,
    ConfigDict,
    Field,
    HttpUrl,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.schemas.formats import HTTP_URL, campaign_rules, wall_clock_window
from notiflow.schemas.messages import ChannelSender, TemplateId, Wire

if TYPE_CHECKING:
    from notiflow.correlation import CorrelationKeys

CampaignState = Literal["scheduled", "running", "paused", "cancelled", "completed", "failed"]
LIVE_STATES: frozenset[str] = frozenset({"scheduled", "running", "paused"})
"""States that hold one of the tenant's active-campaign slots."""
CAMPAIGN_TIERS = frozenset({Tier.P2, Tier.P3})
ManifestFormat = Literal["csv", "jsonl"]
ID_PREFIX = "cmp_"
"""Every campaign id, and so every campaign message id, starts with it."""
ROW_PURPOSE = "campaign-row"
"""What a row message id's tag is made over, with the campaign id and the row."""
_ID = re.compile(r"^(cmp_[0-9a-f]{32})_(([1-9][0-9]{0,11})(?:[secpi][0-9a-f])?)_([a-z2-7]{13})$")
LEG_CODES: Final = {Channel.SMS: "s", Channel.EMAIL: "e", Channel.CHAT: "c",
                    Channel.PUSH: "p", Channel.INAPP: "i"}
"""A leg's channel in a row-leg message id."""
MAX_LEG_ROW: Final = 99_999_999_999
"""The last row a row-leg message id can name (11 digits: the id stays within 64)."""
_COLUMN = r"^[A-Za-z0-9_. -]{1,128}$"
_VARIABLE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


def new_campaign_id() -> str:
    return f"{ID_PREFIX}{uuid.uuid4().hex}"


def row_message_id(keys: CorrelationKeys, campaign_id: str, row: int) -> str:
    """The message of manifest row ``row`` (1-based) of ``campaign_id``:
    ``{campaign_id}_{row}_{tag}``, the tag made by the current key (at most 63 characters)."""
    return f"{campaign_id}_{row}_{keys.tag(ROW_PURPOSE, campaign_id, str(row))}"


def row_leg_message_id(keys: CorrelationKeys, campaign_id: str, row: int, channel: Channel,
                       index: int) -> str:
    """The message of row ``row`` of a topic campaign on ``channel`` to the user's address
    ``index`` (0-15): ``{campaign_id}_{row}{c}{i}_{tag}``, ``c`` the channel's letter
    (:data:`LEG_CODES`), ``i`` the index in hex; rows up to :data:`MAX_LEG_ROW`."""
    if not 1 <= row <= MAX_LEG_ROW or not 0 <= index < 16:
        raise ValueError("row or address index out of range")
    part = f"{row}{LEG_CODES[channel]}{index:x}"
    return f"{campaign_id}_{part}_{keys.tag(ROW_PURPOSE, campaign_id, part)}"


def parse_row_message_id(keys: CorrelationKeys, message_id: str) -> tuple[str, int] | None:
    """(campaign id, row) of a campaign's message (a row's or a row leg's); None for any
    other message, including one shaped like a campaign's whose tag none of ``keys``
    made."""
    m = _ID.fullmatch(message_id)
    if m is None or not keys.valid(m.group(4), ROW_PURPOSE, m.group(1), m.group(2)):
        return None
    return m.group(1), int(m.group(3))


def format_of(uri: str, declared: ManifestFormat | None) -> ManifestFormat:
    """The manifest's format: as declared, else from its name (``.csv``, ``.jsonl``,
    ``.ndjson``); ValueError when neither tells."""
    if declared is not None:
        return declared
    name = uri.lower().rsplit("/", 1)[-1]
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    raise ValueError("format: name the manifest .csv or .jsonl, or set format")


def _variable_columns(schema: dict[str, Any]) -> None:
    schema["properties"]["variables"].update(
        propertyNames={"pattern": _VARIABLE},
        additionalProperties={"type": "string", "pattern": _COLUMN})


class ColumnMapping(Wire):
    """Which manifest column holds what: the recipient (E.164 number, e-mail address or
    device token), the push platform (push only), the recipient's IANA zone and locale
    (optional), and each template variable's column."""

    model_config = ConfigDict(json_schema_extra=_variable_columns)

    recipient: str = Field(pattern=_COLUMN)
    platform: str | None = Field(None, pattern=_COLUMN)
    timezone: str | None = Field(None, pattern=_COLUMN)
    locale: str | None = Field(None, pattern=_COLUMN)
    """The column of the recipient's BCP 47 locale (the template variant); empty: the
    default content."""
    variables: dict[str, str] = Field(default_factory=dict, max_length=64)

    @field_validator("variables")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        for name, column in v.items():
            if not re.fullmatch(_VARIABLE, name):
                raise ValueError(f"invalid variable name {name!r}")
            if not re.fullmatch(_COLUMN, column):
                raise ValueError(f"invalid column name {column!r}")
        return v


class LocalWindow(Wire):
    """Local wall-clock hours a recipient may be sent to, in the recipient's zone;
    ``start`` > ``end`` spans midnight. Quiet hours of the recipient's preferences still
    apply on top."""

    model_config = ConfigDict(json_schema_extra=wall_clock_window)

    start: time
    end: time

    @model_validator(mode="after")
    def _shape(self) -> LocalWindow:
        if self.start.tzinfo is not None or self.end.tzinfo is not None:
            raise ValueError("window times are local wall-clock times, without an offset")
        if self.start == self.end:
            raise ValueError("window start and end must differ")
        return self

    def contains(self, local: time) -> bool:
        local = local.replace(tzinfo=None)
        if self.start < self.end:
            return self.start <= local < self.end
        return local >= self.start or local < self.end

    def next_open(self, at: datetime, zone: ZoneInfo) -> datetime:
        """The first instant from ``at`` (aware) whose wall-clock time in ``zone`` is inside
        the window: ``at`` itself, else where the wall clock reaches ``start``, else a DST
        transition that lands inside (a start in a gap opens at the gap's end when the window
        is still open then; a repeated hour may open the window a second time)."""
        local = at.astimezone(zone)
        if self.contains(local.time()):
            return at
        since, offset = at.astimezone(UTC), local.utcoffset()
        for _ in range(4):
            assert offset is not None
            wall = (since + offset).replace(tzinfo=None)
            opens = datetime.combine(wall.date(), self.start)
            if opens <= wall:
                opens += timedelta(days=1)
            instant = (opens - offset).replace(tzinfo=UTC)
            if instant.astimezone(zone).utcoffset() == offset:
                return instant.astimezone(at.tzinfo)
            since = _transition(since, instant, zone)
            local = since.astimezone(zone)
            offset = local.utcoffset()
            if self.contains(local.time()):
                return since.astimezone(at.tzinfo)
        raise AssertionError("a window opens within a few days")


def _transition(after: datetime, before: datetime, zone: ZoneInfo) -> datetime:
    """The first whole second in (``after``, ``before``] whose UTC offset in ``zone`` differs
    from ``after``'s (the caller knows there is one; zone transitions fall on whole seconds)."""
    offset = after.astimezone(zone).utcoffset()
    lo, hi = math.floor(after.timestamp()), math.ceil(before.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if datetime.fromtimestamp(mid, zone).utcoffset() == offset:
            lo = mid
        else:
            hi = mid
    return datetime.fromtimestamp(hi, UTC)


class CampaignRequest(Wire):
    """Body of ``POST /v1/campaigns``."""

    model_config = ConfigDict(json_schema_extra=campaign_rules)

    name: str = Field(min_length=1, max_length=200)
    channel: Channel
    tier: Tier = Tier.P3
    category: Category = Category.MARKETING
    template_id: TemplateId
    template_version: int = Field(ge=1, le=1_000_000)
    manifest: str = Field(min_length=6, max_length=2048)
    """``s3://bucket/key`` or ``file:///path`` (the deployment's object store)."""
    format: ManifestFormat | None = None
    mapping: ColumnMapping
    starts_at: AwareDatetime | None = None
    """None: now."""
    ends_at: AwareDatetime | None = None
    """End of the campaign's window: rows not expanded by then are not sent, and every
    message expires then. None: ``campaigns.default_duration`` after the start."""
    window: LocalWindow | None = None
    timezone: str | None = Field(None, min_length=1, max_length=64)
    """Zone of a row whose own zone is unknown (no zone column value, not an SMS number
    with one zone); None: the tenant's."""
    max_rate: float | None = Field(None, gt=0, le=100_000)
    """Messages per second at most; None: ``campaigns.default_rate``."""
    quota: int | None = Field(None, ge=1, le=1_000_000_000)
    """Messages at most; rows past it are not sent (the campaign completes with reason
    ``quota``). None: the tenant's ``max_recipients``."""
    webhook: Annotated[HttpUrl | None,
                       WithJsonSchema({"anyOf": [HTTP_URL, {"type": "null"}]})] = None
    """Where each state change of the campaign is POSTed (``campaign.state``, signed like
    status webhooks with the tenant's secrets)."""
    sender: ChannelSender = None
    """Who every message of the campaign comes from (as a send request's ``sender``)."""

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                ZoneInfo(v)
            except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
                raise ValueError(f"unknown time zone {v!r}") from exc
        return v

    @model_validator(mode="after")
    def _shape(self) -> CampaignRequest:
        if self.tier not in CAMPAIGN_TIERS:
            raise ValueError("tier: campaigns are P2 or P3")
        if (self.channel is Channel.PUSH) != (self.mapping.platform is not None):
            raise ValueError("mapping.platform: required for push, and only for push")
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")
        format_of(self.manifest, self.format)
        return self


class CampaignCounts(Wire):
    """Where a campaign's rows are. ``read`` = ``expanded`` + ``rejected`` + rows held back
    by the quota; ``waiting``: expanded rows held for their recipient's local window;
    delivery counts are messages that ever reached the status (a funnel)."""

    read: int = 0
    expanded: int = 0
    rejected: int = 0
    waiting: int = 0
    provider_accepted: int = 0
    delivered: int = 0
    failed: int = 0
    suppressed: int = 0
    expired: int = 0
    cancelled: int = 0


class CampaignView(Wire):
    """One campaign as ``GET /v1/campaigns/{id}`` shows it."""

    campaign_id: str
    name: str
    state: CampaignState
    reason: str | None = None
    channel: Channel
    tier: Tier
    template_id: str
    template_version: int
    manifest: str
    """The manifest; for a topic send, the snapshot of its subscribers."""
    topic: str | None = None
    """The topic of a topic send (``POST /v1/topics/{topic}/messages``)."""
    starts_at: datetime
    ends_at: datetime
    max_rate: float
    quota: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    manifest_bytes: int | None = None
    bytes_read: int = 0
    counts: CampaignCounts
    remaining: int | None = None
    """Rows not read yet, estimated from the bytes left and the mean row size."""
    rate: float | None = None
    """Rows read per second since the start."""
    eta: datetime | None = None


class CampaignList(Wire):
    campaigns: tuple[CampaignView, ...]


class RowError(Wire):
    """One rejected manifest row: its number and why (no recipient data)."""

    row: int
    reason: str


MAX_ROW = 999_999_999_999
"""The last row number a campaign message id can name (12 digits)."""


class RowMessage(Wire):
    """``GET /v1/campaigns/{id}/rows/{row}``: the message id of one manifest row (the
    message exists once the row is expanded)."""

    row: int = Field(ge=1, le=MAX_ROW)
    message_id: str


class ErrorReport(Wire):
    """``GET /v1/campaigns/{id}/errors``: rejected rows in row order, paged by ``after``."""

    errors: tuple[RowError, ...]
    next_after: int | None = None
