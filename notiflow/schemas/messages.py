"""Wire contracts: the send request, the topic envelopes, status events, attempts, receipts.

These pydantic models are the only definition of the payloads; ``notiflow schemas export``
writes them as JSON Schema for upstream producers (``schemas/json/``).
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Final, Literal

import phonenumbers
from email_validator import EmailNotValidError, validate_email
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from notiflow.chat_hooks import webhook_url
from notiflow.schemas.enums import Category, Channel, PushPlatform, Status, Tier
from notiflow.schemas.formats import (
    ALPHANUMERIC_SENDER_PATTERN,
    APNS_TOKEN_PATTERN,
    E164_PATTERN,
    FCM_TOKEN_PATTERN,
    INAPP_PATTERN,
    LOCALE_PATTERN,
    SHORT_CODE_PATTERN,
    TEMPLATE_ID_PATTERN,
    VARIABLE_NAME_PATTERN,
    push_token_rule,
    send_request_rules,
)
from notiflow.schemas.locales import MAX_LOCALE, Locale

SCHEMA_VERSION: Final = 1
MAX_VARIABLES = 64
MAX_VARIABLE_VALUE = 4096
MAX_VARIABLES_BYTES = 16_384
_MESSAGE_ID_NAMESPACE = uuid.UUID("5b7c3e0e-6f0b-4c55-9a63-0c6a1f0d2f61")
_VARIABLE_NAME = re.compile(VARIABLE_NAME_PATTERN)
_APNS_TOKEN = re.compile(APNS_TOKEN_PATTERN)
_FCM_TOKEN = re.compile(FCM_TOKEN_PATTERN)
_E164 = re.compile(E164_PATTERN)
_SHORT_CODE = re.compile(SHORT_CODE_PATTERN)
_INAPP = re.compile(INAPP_PATTERN)
_ALPHANUMERIC_SENDER = re.compile(ALPHANUMERIC_SENDER_PATTERN)
MAX_ALPHANUMERIC_SENDER = 11

MessageId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
TenantId = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
TemplateId = Annotated[str, Field(pattern=TEMPLATE_ID_PATTERN)]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")]
ProviderKey = Annotated[str, Field(min_length=1, max_length=64)]


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def derived_message_id(*parts: str) -> str:
    """A deterministic id, so a replayed or re-produced record maps to the same message."""
    return f"msg_{uuid.uuid5(_MESSAGE_ID_NAMESPACE, ':'.join(parts)).hex}"


def _e164(value: str) -> str:
    if not _E164.fullmatch(value):
        raise ValueError("phone number must be in E.164 form, e.g. +14155550123")
    try:
        parsed = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException as exc:
        raise ValueError(f"phone number cannot be parsed: {exc}") from None
    if not phonenumbers.is_valid_number(parsed):
        raise ValueError("phone number is not a valid number for its country code")
    return value


def _email(value: str) -> str:
    try:
        return validate_email(value, check_deliverability=False).normalized
    except EmailNotValidError as exc:
        raise ValueError(f"invalid email address: {exc}") from None


def _webhook(value: str) -> str:
    webhook_url(value)
    return value


def _inapp(value: str) -> str:
    if not _INAPP.fullmatch(value):
        raise ValueError("an INAPP recipient is inapp:<user id> (letters, digits and ._@+:-, "
                         "1-128 characters)")
    return value


def inapp_user(recipient: str) -> str:
    """The user id of an ``inapp:<user id>`` recipient."""
    return recipient.removeprefix("inapp:")


def sender_for(channel: Channel | None, value: str | None) -> str | None:
    """``value`` as a sender of ``channel`` (an email address normalised); ``ValueError``
    for a form the channel does not take (SMS: E.164 number, short code or alphanumeric id
    of at most 11 characters; EMAIL: an address; PUSH: none)."""
    if value is None:
        return None
    if channel is Channel.SMS:
        if value.startswith("+"):
            return _e164(value)
        if _SHORT_CODE.fullmatch(value) or (
                len(value) <= MAX_ALPHANUMERIC_SENDER and _ALPHANUMERIC_SENDER.fullmatch(value)):
            return value
        raise ValueError("an SMS sender is an E.164 number, a short code (3-8 digits) or an "
                         "alphanumeric id (at most 11 letters, digits and spaces, one letter "
                         "at least)")
    if channel is Channel.EMAIL:
        return _email(value)
    raise ValueError(f"{channel.value if channel else 'this channel'} messages have no sender")


def _sender_of_channel(value: str | None, info: ValidationInfo) -> str | None:
    channel = info.data.get("channel")
    return value if channel is None else sender_for(channel, value)


ChannelSender = Annotated[Annotated[str, Field(max_length=254)] | None,
                          AfterValidator(_sender_of_channel)]
"""A model's ``sender``: :func:`sender_for` the model's ``channel`` (a field declared before
it; left alone when the channel itself failed)."""
PhoneNumber = Annotated[str, AfterValidator(_e164)]
EmailAddress = Annotated[str, Field(max_length=254), AfterValidator(_email)]
ChatWebhookUrl = Annotated[str, AfterValidator(_webhook)]


class Wire(BaseModel):
    """Base of every wire model: unknown fields are rejected, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class PushRecipient(Wire):
    model_config = ConfigDict(json_schema_extra=push_token_rule)

    device_token: str = Field(min_length=32, max_length=4096)
    platform: PushPlatform

    @model_validator(mode="after")
    def _token_shape(self) -> PushRecipient:
        pattern = _APNS_TOKEN if self.platform is PushPlatform.IOS else _FCM_TOKEN
        if not pattern.fullmatch(self.device_token):
            raise ValueError(f"device_token is not a valid {self.platform.value} token")
        return self


Recipient = str | PushRecipient
VariableValue = str | int | float | bool | None


def bounded_variables(v: dict[str, VariableValue]) -> dict[str, VariableValue]:
    """``v`` when it holds at most :data:`MAX_VARIABLES` variables with valid names, strings
    of at most :data:`MAX_VARIABLE_VALUE` characters and :data:`MAX_VARIABLES_BYTES` in all
    (names and values as text); ValueError otherwise."""
    if len(v) > MAX_VARIABLES:
        raise ValueError(f"at most {MAX_VARIABLES} variables")
    size = 0
    for name, value in v.items():
        if not _VARIABLE_NAME.fullmatch(name):
            raise ValueError(f"invalid variable name {name!r}")
        if isinstance(value, str) and len(value) > MAX_VARIABLE_VALUE:
            raise ValueError(f"variable {name!r} longer than {MAX_VARIABLE_VALUE} chars")
        size += len(name) + len(str(value))
    if size > MAX_VARIABLES_BYTES:
        raise ValueError(f"variables larger than {MAX_VARIABLES_BYTES} bytes")
    return v


Variables = Annotated[dict[str, VariableValue], AfterValidator(bounded_variables)]


def schedule_bounds(tier: Tier, scheduled_at: datetime | None,
                    expires_at: datetime | None) -> None:
    """ValueError unless ``scheduled_at`` is unset, or set for P2/P3 and before
    ``expires_at``."""
    if scheduled_at is None:
        return
    if tier not in (Tier.P2, Tier.P3):
        raise ValueError("scheduled_at is allowed for P2 and P3 only")
    if expires_at is not None and scheduled_at >= expires_at:
        raise ValueError("scheduled_at must be before expires_at")


class SendRequest(Wire):
    """Body of ``POST /v1/messages`` (docs/design.md, "Send request and acceptance")."""

    model_config = ConfigDict(json_schema_extra=send_request_rules)

    channel: Channel
    tier: Tier
    recipient: Recipient
    template_id: TemplateId
    template_version: int = Field(ge=1, le=1_000_000)
    variables: Variables = Field(default_factory=dict)
    category: Category = Category.TRANSACTIONAL
    expires_at: AwareDatetime | None = None
    scheduled_at: AwareDatetime | None = None
    ordering_key: str | None = Field(None, min_length=1, max_length=256)
    status_webhook: HttpUrl | None = None
    sender: ChannelSender = None
    """Who the message comes from (:func:`sender_for`); None: the provider account's own."""
    locale: Locale | None = None
    """The language the recipient reads: the template's variant for it, else for its
    language, else its default content (``schemas/locales.py``)."""

    @field_validator("recipient")
    @classmethod
    def _recipient_matches_channel(cls, r: Recipient, info: ValidationInfo) -> Recipient:
        channel = info.data.get("channel")
        if channel is Channel.PUSH:
            if not isinstance(r, PushRecipient):
                raise ValueError("PUSH recipient must be {device_token, platform}")
            return r
        if isinstance(r, PushRecipient):
            raise ValueError(f"{channel.value if channel else 'SMS/EMAIL/CHAT/INAPP'} recipient "
                             "must be a string")
        if channel is Channel.SMS:
            return _e164(r)
        if channel is Channel.EMAIL:
            return _email(r)
        if channel is Channel.CHAT:
            return _webhook(r)
        if channel is Channel.INAPP:
            return _inapp(r)
        return r

    @model_validator(mode="after")
    def _schedule_bounds(self) -> SendRequest:
        schedule_bounds(self.tier, self.scheduled_at, self.expires_at)
        return self

    def recipient_key(self) -> str:
        """The recipient as one string (for hashing, caps and dedup)."""
        r = self.recipient
        if isinstance(r, PushRecipient):
            return f"{r.platform.value}:{r.device_token}"
        return r.lower() if self.channel is Channel.EMAIL else r


class UserStamp(Wire):
    """The user a message was sent to, as the send flow needs it: a keyed hash of the user
    id (``redact.recipient_hash`` of ``user:<id>``) and the user's time zone."""

    user_hash: str = Field(min_length=1, max_length=128)
    timezone: str | None = Field(None, max_length=64)


class IngestRecord(SendRequest):
    """Value of an ``ingest.{channel}.{tier}`` record.

    Written by the Messaging API (with ``message_id`` and ``accepted_at``) or directly by an
    upstream producer (which may omit both: the send flow then derives a stable message id
    from the idempotency key, or from the record's topic/partition/offset, and uses the
    Kafka timestamp as acceptance time).
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    tenant_id: TenantId
    message_id: MessageId | None = None
    idempotency_key: IdempotencyKey | None = None
    accepted_at: AwareDatetime | None = None
    attempt: int = Field(1, ge=1, le=1000)
    not_before: AwareDatetime | None = None
    avoid_provider: str | None = Field(None, max_length=64)
    """The provider that failed the previous attempt (tried last by the router)."""
    provider_waits: dict[ProviderKey, AwareDatetime] | None = Field(None, max_length=8)
    """Accounts that answered this message with ``Retry-After``, and when that wait ends: the
    router passes such an account over until then while another can carry the message, and
    the retry is not held for the wait of an account it will not use."""
    paced_until: AwareDatetime | None = None
    """Set by the send flow on a chat message its webhook's pace put later: it holds the slot
    from then on, and its send at or after that time takes no other."""
    unknown_check: int | None = Field(None, ge=1)
    """Set on a check record: decide whether attempt ``unknown_check``, whose outcome was
    ambiguous, was ever resolved by a receipt; FAILED (ambiguous) when not. Nothing is sent."""
    budget_base: int | None = Field(None, ge=1, le=1000)
    """Set by ``notiflow dlq replay``: the attempt number a fresh retry budget starts from
    (``attempt == budget_base`` is the first attempt of that budget; later retries keep the
    field). None = the budget starts at attempt 1."""
    budget_started_at: AwareDatetime | None = None
    """Set by the send flow on a retry record: when the first attempt of the current retry
    budget failed. The windows of its later retries are measured from it (``flows/send/policy.py``);
    ignored on the first attempt of a budget."""
    order_seq: str | None = Field(None, max_length=64, pattern=r"^[0-9a-f]{1,32}:[0-9]{1,18}$")
    """Set by the send flow on a record with an ``ordering_key``: ``{epoch}:{n}``, the record's
    place among its key's messages (``flows/send/ordering.py``); its retries keep it."""

    user: UserStamp | None = None
    """Set by the API on a message of a send to a user: caps count per user, and quiet
    hours use the user's zone when the address has none."""

    @classmethod
    def stamped(cls, req: SendRequest, *, tenant_id: str, message_id: str,
                idempotency_key: str | None, accepted_at: datetime,
                expires_at: datetime, user: UserStamp | None = None) -> IngestRecord:
        """``req`` (validated already) with the API's stamps, not validated a second time:
        equal to ``model_validate`` of the same fields whenever the stamps are valid (the
        API mints ``message_id`` and ``accepted_at``; the tenant comes from its settings)."""
        fields = dict(req)
        fields.update(tenant_id=tenant_id, message_id=message_id,
                      idempotency_key=idempotency_key, accepted_at=accepted_at,
                      expires_at=expires_at, user=user)
        return cls.model_construct(**fields)

    def request(self) -> SendRequest:
        return SendRequest.model_validate(
            self.model_dump(include=set(SendRequest.model_fields), mode="python")
        )

    def partition_key(self) -> bytes:
        """The Kafka key: ``tenant_id:ordering_key`` when an ordering key is set (order within
        the key), else ``message_id``."""
        if self.ordering_key:
            return f"{self.tenant_id}:{self.ordering_key}".encode()
        return (self.message_id or "").encode()


class AttemptRecord(Wire):
    """One provider call (Cassandra ``attempts``)."""

    attempt_no: int = Field(ge=1)
    provider_id: str
    outcome: Literal["accepted", "transient", "permanent", "ambiguous"]
    provider_message_id: str | None = None
    normalized_error: str | None = None
    error_code: str | None = None
    retry_after_s: float | None = None
    started_at: AwareDatetime
    completed_at: AwareDatetime


class MessageSnapshot(Wire):
    """What the reconciler needs to create a message row it has not seen (direct producers)."""

    tenant_id: TenantId
    channel: Channel
    tier: Tier
    category: Category
    template_id: TemplateId
    template_version: int
    recipient_hash: str
    recipient_masked: str
    accepted_at: AwareDatetime
    expires_at: AwareDatetime | None = None
    scheduled_at: AwareDatetime | None = None
    idempotency_key: str | None = None
    ordering_key: str | None = None
    status_webhook: str | None = None


class StatusEvent(Wire):
    """Value of a ``notify.events`` record (key = message_id)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: str
    message_id: MessageId
    tenant_id: TenantId
    channel: Channel
    tier: Tier
    status: Status
    attempt: int = Field(0, ge=0)
    reason: str | None = None
    occurred_at: AwareDatetime
    source: str
    attempt_detail: AttemptRecord | None = None
    message: MessageSnapshot | None = None
    next_attempt_at: AwareDatetime | None = None
    _traceparent: str | None = PrivateAttr(default=None)
    """In-process only, never serialised: the W3C ``traceparent`` the record travels with
    (its Kafka header; ``notiflow.telemetry``)."""

    @staticmethod
    def make_id(message_id: str, status: Status, attempt: int, extra: str = "") -> str:
        """Deterministic id: the same transition replayed yields the same event id."""
        return f"{message_id}:{status.value}:{attempt}{':' + extra if extra else ''}"


class Receipt(Wire):
    """Value of a ``notify.receipts`` record: a provider delivery report, normalised."""

    schema_version: Literal[1] = SCHEMA_VERSION
    provider_id: str
    provider_event_id: str
    provider_message_id: str
    status: Literal[
        Status.SENT,
        Status.DELIVERED,
        Status.FAILED,
        Status.BOUNCED,
        Status.OPENED,
        Status.CLICKED,
    ]
    occurred_at: AwareDatetime
    raw_status: str | None = None
    error_code: str | None = None
    message_id: MessageId | None = None
    """Correlation hint carried by the provider callback (signed), when the adapter set one."""
    attempt: int | None = Field(None, ge=1)
    parked_since: AwareDatetime | None = None
    """Set by the reconciler on a receipt it could not correlate yet (tried again later)."""
    _traceparent: str | None = PrivateAttr(default=None)
    """In-process only, never serialised: the W3C ``traceparent`` of its Kafka header."""
    not_before: AwareDatetime | None = None


class DlqRecord(Wire):
    """Value of a ``notify.dlq.{tier}`` record. The original bytes are encrypted (Fernet)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    dlq_id: str
    tier: Tier | None = None
    reason: str
    error_class: str
    category: Literal["invalid_data", "provider_outage", "bug", "unavailable"]
    failed_at: AwareDatetime
    source_topic: str
    source_partition: int
    source_offset: int
    source_timestamp_ms: int | None = None
    message_id: str | None = None
    tenant_id: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    payload_encrypted: str
    rendered_encrypted: str | None = None
    """The rendered message (subject and body) when it had been rendered, encrypted."""
    attempts: tuple[AttemptRecord, ...] = ()


class LocaleContent(Wire):
    """A template version's content in one locale: the same variables as its default."""

    subject: str | None = Field(None, max_length=998)
    body: str = Field(min_length=1, max_length=65_536)


def _locale_keys(schema: dict[str, Any]) -> None:
    """``locales`` in JSON Schema: keys of the locale pattern, each a ``LocaleContent``."""
    locales = schema["properties"]["locales"]
    (content,) = locales.pop("patternProperties").values()
    locales.update(propertyNames={"pattern": LOCALE_PATTERN, "maxLength": MAX_LOCALE},
                   additionalProperties=content)


class TemplateCreate(Wire):
    """Body of ``POST /v1/templates``; omit ``version`` to get the next one."""

    model_config = ConfigDict(json_schema_extra=_locale_keys)

    template_id: TemplateId
    channel: Channel
    version: int | None = Field(None, ge=1, le=1_000_000)
    subject: str | None = Field(None, max_length=998)
    body: str = Field(min_length=1, max_length=65_536)
    description: str | None = Field(None, max_length=1024)
    locales: dict[Locale, LocaleContent] = Field(default_factory=dict, max_length=64)
    """Variants by locale (``fr``, ``fr-CA``); the content above is the default."""

    @field_validator("locales", mode="before")
    @classmethod
    def _each_once(cls, v: Any) -> Any:
        if isinstance(v, dict):
            tags = [k.lower() for k in v if isinstance(k, str)]
            if len(set(tags)) != len(tags):
                raise ValueError("each locale is listed once (tags compare in any case)")
        return v


class TemplateVersion(Wire):
    tenant_id: TenantId
    template_id: TemplateId
    version: int
    channel: Channel
    subject: str | None
    body: str
    variables: tuple[str, ...]
    checksum: str
    created_at: datetime
    locales: dict[str, LocaleContent] = Field(default_factory=dict)


class Accepted(Wire):
    """``202`` body of ``POST /v1/messages``."""

    message_id: str
    status: Literal[Status.QUEUED, Status.SCHEDULED]
    accepted_at: datetime


class Cancelled(Wire):
    """``200`` body of ``DELETE /v1/messages/{id}``."""

    message_id: str
    status: Literal[Status.CANCELLED] = Status.CANCELLED
    cancelled_at: datetime


class AttemptView(Wire):
    attempt_no: int
    provider_id: str | None
    provider_message_id: str | None
    outcome: str | None
    normalized_error: str | None
    started_at: datetime | None
    completed_at: datetime | None


class MessageHead(Wire):
    """What every API view of a message shows first (no recipient, no variables)."""

    message_id: str
    status: Status
    reason: str | None
    channel: Channel
    tier: Tier
    category: str | None
    template_id: str | None
    template_version: int | None


class MessageView(MessageHead):
    """``GET /v1/messages/{id}``."""

    accepted_at: datetime | None
    updated_at: datetime | None
    attempts: tuple[AttemptView, ...]


def json_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schema of every contract an external party produces or consumes."""
    models: dict[str, type[BaseModel]] = {
        "send_request": SendRequest,
        "ingest_record": IngestRecord,
        "status_event": StatusEvent,
        "receipt": Receipt,
        "dlq_record": DlqRecord,
        "template_create": TemplateCreate,
        "accepted": Accepted,
        "message_view": MessageView,
    }
    return {name: model.model_json_schema() for name, model in models.items()}
