"""Pure steps of the send and reconcile dataflows (no I/O)."""

from __future__ import annotations

import copy
import uuid
import weakref
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from bytewax.connectors.kafka import KafkaError, KafkaSourceMessage
from bytewax.operators import StatefulLogic
from opentelemetry.metrics import CallbackOptions, Observation
from pydantic import ValidationError

from notiflow import ingest_binding, names
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.envelope import EnvelopeError, dump, envelope
from notiflow.adapters.kafka_io import OutRecord, header, make_headers
from notiflow.flows.common.items import Out, Retry, SourcedReceipt, SourceRef, Work, utcnow
from notiflow.redact import mask, recipient_hash
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import (
    AttemptRecord,
    DlqRecord,
    IngestRecord,
    MessageSnapshot,
    Receipt,
    StatusEvent,
    derived_message_id,
)
from notiflow.settings import Settings
from notiflow.telemetry import current_traceparent, header_traceparent, meter

Clock = Callable[[], datetime]
_suppressions = names.SUPPRESSIONS.create(meter())
_expirations = names.EXPIRATIONS.create(meter())
_ingested = names.INGEST_MESSAGES.create(meter())
_claims_refused = names.INGEST_CLAIMS_REFUSED.create(meter())
_lateness = names.SCHEDULER_LATENESS.create(meter())
RawMessage = KafkaSourceMessage[bytes | None, bytes | None] | KafkaError[Any, Any]


def source_of(msg: KafkaSourceMessage[Any, Any]) -> SourceRef:
    ts = msg.timestamp[1] if msg.timestamp and msg.timestamp[0] else None
    return SourceRef(msg.topic or "", msg.partition or 0, msg.offset or 0, ts)


def validation_reason(exc: ValueError) -> str:
    """A readable summary of a validation error without echoing the input (PII); any other
    ``ValueError`` (a JSON or envelope error) as its message."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    parts = []
    for err in exc.errors(include_input=False, include_url=False)[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def dead_letter(
    *, raw: bytes | None, source: SourceRef, reason: str, error_class: str, category: str,
    tier: Tier | None, cipher: DlqCipher, now: datetime, message_id: str | None = None,
    tenant_id: str | None = None, headers: Iterable[tuple[str, bytes | None]] = (),
    attempts: tuple[AttemptRecord, ...] = (),
) -> DlqRecord:
    return DlqRecord(
        dlq_id=uuid.uuid4().hex,
        tier=tier,
        reason=reason,
        error_class=error_class,
        category=category,
        failed_at=now,
        source_topic=source.topic,
        source_partition=source.partition,
        source_offset=source.offset,
        source_timestamp_ms=source.timestamp_ms,
        message_id=message_id,
        tenant_id=tenant_id,
        headers={k: v.decode(errors="replace") for k, v in headers if v is not None
                 and k != "traceparent"},
        payload_encrypted=cipher.encrypt(raw),
        attempts=attempts,
    )


class IngestParser:
    """Bytes from ``ingest.{channel}.{tier}`` → :class:`Work`, or an error as data:
    a :class:`DlqRecord` (unparseable, unknown schema, not bound to the tenant it names
    (``tenant_claim_refused``, :mod:`notiflow.ingest_binding`), unknown tenant, wrong topic, a
    category its tier may not carry, unavailable channel) or a FAILED :class:`StatusEvent`
    (tenant not allowed to use the tier/channel)."""

    def __init__(self, settings: Settings, tier: Tier | None, cipher: DlqCipher,
                 clock: Clock) -> None:
        self.settings = settings
        self.tier = tier
        self.cipher = cipher
        self.clock = clock
        self.enabled = settings.enabled_channels()
        self.sealer = envelope(settings)
        self.binder: ingest_binding.Binder = ingest_binding.binder(settings)
        self.topics = ({} if tier is None else
                       {settings.ingest_topic(c, tier): c for c in Channel})

    def __call__(self, msg: RawMessage) -> Work | DlqRecord | StatusEvent:
        now = self.clock()
        if isinstance(msg, KafkaError):
            src = source_of(msg.msg)
            return self._dlq(msg.msg.value, src, f"kafka error: {msg.err}", "consumer_error",
                             "bug", now, msg.msg.headers)
        src = source_of(msg)
        raw = msg.value
        if raw is None:
            return self._dlq(raw, src, "empty value (tombstone)", "poison", "invalid_data", now,
                             msg.headers)
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._dlq(raw, src, f"not JSON: {exc}", "poison", "invalid_data", now,
                             msg.headers)
        if not isinstance(doc, dict):
            return self._dlq(raw, src, "JSON value is not an object", "poison", "invalid_data",
                             now, msg.headers)
        version = doc.get("schema_version", 1)
        if version != 1:
            return self._dlq(raw, src, f"unknown schema_version {version!r}", "unknown_schema",
                             "invalid_data", now, msg.headers)
        refused = self._unbound(doc, raw, src, msg.headers, now)
        if refused is not None:
            return refused
        try:
            doc = self.sealer.open(doc)
        except EnvelopeError as exc:
            return self._dlq(raw, src, f"sealed record: {exc}", "sealed", "invalid_data", now,
                             msg.headers, tenant_id=doc.get("tenant_id") if isinstance(
                                 doc.get("tenant_id"), str) else None)
        try:
            record = IngestRecord.model_validate(doc)
        except ValidationError as exc:
            return self._dlq(raw, src, f"invalid record: {validation_reason(exc)}",
                             "validation", "invalid_data", now, msg.headers,
                             tenant_id=doc.get("tenant_id") if isinstance(
                                 doc.get("tenant_id"), str) else None)
        if self.tier is not None and (
                self.topics.get(src.topic, record.channel) is not record.channel
                or record.tier is not self.tier):
            return self._dlq(raw, src, f"{record.channel}/{record.tier} record on topic "
                             f"{src.topic}", "wrong_topic", "invalid_data", now, msg.headers,
                             tenant_id=record.tenant_id)
        tenant = self.settings.tenant(record.tenant_id)
        if tenant is None:
            return self._dlq(raw, src, f"unknown tenant {record.tenant_id!r}", "unknown_tenant",
                             "invalid_data", now, msg.headers, tenant_id=record.tenant_id,
                             tier=record.tier)
        if record.accepted_at is None:
            # the API always stamps accepted_at (and counts source=api itself); retries and
            # checks carry the first acceptance, so this counts each direct record once
            _ingested.add(1, {"tenant": record.tenant_id, "channel": record.channel.value,
                              "tier": record.tier.value, "source": "kafka"})
        record = complete_record(record, src, self.settings)
        work = Work(record, src, raw, msg.key, tuple(msg.headers or ()), now.timestamp())
        if record.tier not in tenant.tiers or record.channel not in tenant.channels:
            reason = ("tier_not_allowed" if record.tier not in tenant.tiers
                      else "channel_not_allowed")
            return status_event(work, Status.FAILED, now, self._source, reason=reason)
        if not tenant.allows_template(record.template_id):
            return status_event(work, Status.FAILED, now, self._source,
                                reason="template_not_allowed")
        if not tenant.allows_sender(record.sender):
            return status_event(work, Status.FAILED, now, self._source,
                                reason="sender_not_allowed")
        if not self.settings.category_tiers.allows(record.category, record.tier):
            return self._dlq(raw, src, f"category {record.category.value} may not be sent at "
                             f"tier {record.tier.value}", "category_tier_not_allowed",
                             "invalid_data", now, msg.headers, message_id=record.message_id,
                             tenant_id=record.tenant_id, tier=record.tier)
        if record.channel not in self.enabled:
            return self._dlq(raw, src, f"no provider configured for {record.channel}",
                             "channel_unavailable", "unavailable", now, msg.headers,
                             message_id=record.message_id, tenant_id=record.tenant_id,
                             tier=record.tier)
        return work

    def _unbound(self, doc: dict[str, Any], raw: bytes, src: SourceRef, headers: Any,
                 now: datetime) -> DlqRecord | None:
        """A ``tenant_claim_refused`` dead letter when the record is not bound to the tenant
        it names (its claim is not used as its source), else None."""
        claimed = doc.get("tenant_id") if isinstance(doc.get("tenant_id"), str) else None
        channel = self.topics.get(src.topic)
        target = ((channel.value, self.tier.value) if channel is not None and self.tier
                  else ingest_binding.claimed_target(doc))
        verdict = self.binder.check(claimed, *target, raw, headers)
        if verdict.bound:
            return None
        _claims_refused.add(1, {"flow": self._source, "reason": verdict.refusal or ""})
        return self._dlq(raw, src, ingest_binding.explain(verdict, claimed),
                         "tenant_claim_refused", "invalid_data", now, headers)

    @property
    def _source(self) -> str:
        return f"send.{self.tier.value.lower() if self.tier else 'shared'}"

    def _dlq(self, raw: bytes | None, src: SourceRef, reason: str, error_class: str,
             category: str, now: datetime, headers: Any, *, message_id: str | None = None,
             tenant_id: str | None = None, tier: Tier | None = None) -> DlqRecord:
        return dead_letter(raw=raw, source=src, reason=reason, error_class=error_class,
                           category=category, tier=self.tier or tier, cipher=self.cipher,
                           now=now,
                           message_id=message_id or header(headers, "message_id"),
                           tenant_id=tenant_id, headers=headers or ())


def complete_record(record: IngestRecord, src: SourceRef, settings: Settings) -> IngestRecord:
    """Fill what a direct producer may omit: a stable message id, acceptance time, expiry."""
    updates: dict[str, Any] = {}
    if record.message_id is None:
        basis = ((record.tenant_id, "idem", record.idempotency_key) if record.idempotency_key
                 else ("kafka", src.topic, str(src.partition), str(src.offset)))
        updates["message_id"] = derived_message_id(*basis)
    accepted = record.accepted_at
    if accepted is None:
        accepted = (datetime.fromtimestamp(src.timestamp_ms / 1000, UTC)
                    if src.timestamp_ms else datetime.now(UTC))
        updates["accepted_at"] = accepted
    if record.expires_at is None:
        updates["expires_at"] = accepted + settings.tier_ttl(record.tier)
    return record.model_copy(update=updates) if updates else record


def snapshot_of(record: IngestRecord) -> MessageSnapshot:
    key = record.recipient_key()
    assert record.accepted_at is not None
    return MessageSnapshot(
        tenant_id=record.tenant_id,
        channel=record.channel,
        tier=record.tier,
        category=record.category,
        template_id=record.template_id,
        template_version=record.template_version,
        recipient_hash=recipient_hash(record.tenant_id, key),
        recipient_masked=mask(key),
        accepted_at=record.accepted_at,
        expires_at=record.expires_at,
        scheduled_at=record.scheduled_at,
        idempotency_key=record.idempotency_key,
        ordering_key=record.ordering_key,
        status_webhook=str(record.status_webhook) if record.status_webhook else None,
    )


def status_event(
    work: Work, status: Status, now: datetime, source: str, *, reason: str | None = None,
    attempt: int | None = None, detail: AttemptRecord | None = None,
    next_attempt_at: datetime | None = None,
) -> StatusEvent:
    """An event about ``work``; carries the message snapshot so the reconciler can create the
    row of a message that did not come through the API. It travels with the current span's
    trace context (the send span), else with the ingest record's ``traceparent``."""
    r = work.record
    n = r.attempt if attempt is None else attempt
    ev = StatusEvent(
        event_id=StatusEvent.make_id(work.message_id, status, n),
        message_id=work.message_id,
        tenant_id=r.tenant_id,
        channel=r.channel,
        tier=r.tier,
        status=status,
        attempt=n,
        reason=reason,
        occurred_at=now,
        source=source,
        attempt_detail=detail,
        message=snapshot_of(r),
        next_attempt_at=next_attempt_at,
    )
    ev._traceparent = current_traceparent() or header_traceparent(work.headers)
    return ev


def is_expired(work: Work, now: datetime) -> bool:
    exp = work.record.expires_at
    return exp is not None and now >= exp


class Hold(StatefulLogic[Any, Any, list[Any]]):
    """Keeps items whose time has not come (retry backoff, ``scheduled_at``, quiet hours, a
    parked receipt's next try) in recoverable state and releases each when due. State = the
    pending items; ``due_of`` gives an item's due time (None = now).

    For :class:`Work` items it records ``notiflow.scheduler.lateness`` on release and keeps
    the ``accepted_at`` of its oldest held retry per tier and channel for
    ``notiflow.retry.oldest_age``."""

    def __init__(self, resume: list[Any] | None, clock: Clock,
                 due_of: Callable[[Any], datetime | None] = lambda w: w.due_at) -> None:
        self.pending: list[Any] = list(resume or [])
        self.clock = clock
        self.due_of = due_of
        self.oldest_retry: dict[tuple[Tier, Channel], datetime] = {}
        self._track(self.pending)
        _holds.add(self)

    def on_item(self, value: Any) -> tuple[Iterable[Any], bool]:
        self.pending.append(value)
        return self._release()

    def on_notify(self) -> tuple[Iterable[Any], bool]:
        return self._release()

    def on_eof(self) -> tuple[Iterable[Any], bool]:
        return [], StatefulLogic.RETAIN

    def _release(self) -> tuple[Iterable[Any], bool]:
        now = self.clock()
        due: list[Any] = []
        keep: list[Any] = []
        for w in self.pending:
            at = self.due_of(w)
            if at is None or at <= now:
                due.append(w)
                if at is not None and isinstance(w, Work):
                    _lateness.record((now - at).total_seconds(), {
                        "tier": w.record.tier.value,
                        "timer": "retry" if w.record.attempt > 1 else "scheduled"})
            else:
                keep.append(w)
        self.pending = keep
        self._track(keep)
        return due, (StatefulLogic.DISCARD if not self.pending else StatefulLogic.RETAIN)

    def _track(self, items: Iterable[Any]) -> None:
        oldest: dict[tuple[Tier, Channel], datetime] = {}
        for w in items:
            if isinstance(w, Work) and w.record.attempt > 1 and w.record.accepted_at:
                key = (w.record.tier, w.record.channel)
                _retry_tiers.add(w.record.tier)
                at = w.record.accepted_at
                oldest[key] = min(oldest.get(key, at), at)
        self.oldest_retry = oldest

    def notify_at(self) -> datetime | None:
        times = [t for t in map(self.due_of, self.pending) if t is not None]
        return min(times) if times else None

    def snapshot(self) -> list[Any]:
        return copy.copy(self.pending)


_holds: weakref.WeakSet[Hold] = weakref.WeakSet()
_retry_tiers: set[Tier] = set()


def observe_retry_oldest(options: CallbackOptions | None = None) -> Iterable[Observation]:
    """``notiflow.retry.oldest_age`` per tier and channel: now - ``accepted_at`` of the oldest
    retry (attempt > 1) the process's :class:`Hold` steps keep, 0 when none (for every tier
    that has held a retry)."""
    oldest: dict[tuple[Tier, Channel], float] = {}
    for h in list(_holds):
        if not h.oldest_retry:
            continue
        now = h.clock()
        for key, at in list(h.oldest_retry.items()):
            oldest[key] = max(oldest.get(key, 0.0), (now - at).total_seconds())
    for tier in sorted(_retry_tiers):
        for channel in Channel:
            yield Observation(max(0.0, oldest.get((tier, channel), 0.0)),
                              {"tier": tier.value, "channel": channel.value})


names.RETRY_OLDEST_AGE.create(meter(), callbacks=[observe_retry_oldest])


def retry_record(work: Work, next_attempt: int, not_before: datetime) -> Retry:
    rec = work.record.model_copy(update={"attempt": next_attempt, "not_before": not_before,
                                         "paced_until": None})
    return Retry(work, rec)


def suppression_reason(reason: str | None) -> str:
    """The bounded ``reason`` attribute of ``notiflow.send.suppressions``: the reason's word
    before ``:`` (``duplicate_content_of:<id>`` → ``duplicate``)."""
    word = (reason or "unknown").split(":", 1)[0]
    return "duplicate" if word == "duplicate_content_of" else word


class Encoder:
    """Typed outputs → Kafka records (topic, key, JSON value, contract headers, the
    ``traceparent`` an event or receipt travels with). Counts the SUPPRESSED and EXPIRED
    events it writes (every path of the send flow ends here). A retry due
    ``scheduling.long_wait`` or more from now goes to ``notify.delayed`` (a scheduler moves
    it into a bucket), a sooner one back to its ingest topic (the hold step keeps it); either
    is bound by the platform key (``nf-binding``)."""

    def __init__(self, settings: Settings, clock: Clock = utcnow) -> None:
        self.settings = settings
        self.sealer = envelope(settings)
        self.binder: ingest_binding.Binder = ingest_binding.binder(settings)
        self.clock = clock

    def __call__(self, out: Out) -> OutRecord:
        s = self.settings
        if isinstance(out, StatusEvent):
            if out.status is Status.SUPPRESSED:
                _suppressions.add(1, {"tier": out.tier.value, "channel": out.channel.value,
                                           "reason": suppression_reason(out.reason)})
            elif out.status is Status.EXPIRED:
                _expirations.add(1, {"tier": out.tier.value,
                                          "channel": out.channel.value})
            return OutRecord(s.events_topic, out.message_id.encode(),
                             out.model_dump_json(exclude_none=True).encode(),
                             make_headers(out.message_id, out.tenant_id, out.tier.value,
                                          out._traceparent))
        if isinstance(out, Retry):
            r = out.record
            wait = r.not_before - self.clock() if r.not_before else None
            topic = (s.delayed_topic if wait is not None and wait >= s.scheduling.long_wait
                     else s.ingest_topic(r.channel, r.tier))
            value = dump(r, self.sealer).encode()
            headers = list(out.work.headers) or make_headers(out.work.message_id, r.tenant_id,
                                                             r.tier.value)
            return OutRecord(topic, out.work.key, value, self.binder.sign(
                headers, r.channel.value, r.tier.value, value))
        if isinstance(out, Receipt):
            return OutRecord(s.receipts_topic, out.provider_message_id.encode(),
                             out.model_dump_json(exclude_none=True).encode(),
                             make_headers(out.message_id or "", None, None,
                                          out._traceparent))
        if isinstance(out, DlqRecord):
            key = (out.message_id or f"{out.source_topic}:{out.source_partition}:"
                   f"{out.source_offset}").encode()
            return OutRecord(s.dlq_topic(out.tier), key,
                             out.model_dump_json(exclude_none=True).encode(),
                             make_headers(out.message_id or "", out.tenant_id,
                                          out.tier.value if out.tier else None))
        raise TypeError(f"cannot encode {type(out).__name__}")


def parse_reconcile(msg: RawMessage, settings: Settings, cipher: DlqCipher,
                    clock: Clock) -> StatusEvent | SourcedReceipt | DlqRecord:
    """A record of ``notify.events`` or ``notify.receipts`` → typed, or a DLQ record."""
    now = clock()
    if isinstance(msg, KafkaError):
        return dead_letter(raw=msg.msg.value, source=source_of(msg.msg),
                           reason=f"kafka error: {msg.err}", error_class="consumer_error",
                           category="bug", tier=None, cipher=cipher, now=now)
    src = source_of(msg)
    model = Receipt if src.topic == settings.receipts_topic else StatusEvent
    tier_h = header(msg.headers, "tier")
    tier = Tier(tier_h) if tier_h is not None and tier_h in Tier.__members__ else None
    try:
        item = model.model_validate_json(msg.value or b"")
    except ValidationError as exc:
        return dead_letter(raw=msg.value, source=src, reason=f"invalid {model.__name__}: "
                           f"{validation_reason(exc)}", error_class="validation",
                           category="invalid_data", tier=tier, cipher=cipher, now=now,
                           message_id=header(msg.headers, "message_id"),
                           headers=msg.headers or ())
    item._traceparent = header_traceparent(msg.headers)
    if isinstance(item, Receipt):
        return SourcedReceipt(item, src, msg.value or b"")
    return item


def scaled_lease_ttl(settings: Settings, tier: Tier) -> timedelta:
    """Dedup lease TTL: at least the tier's TTL (unscaled, so a lease never expires before a
    message could)."""
    return max(settings.policy(tier).ttl, settings.tier_ttl(tier)) + timedelta(minutes=10)
