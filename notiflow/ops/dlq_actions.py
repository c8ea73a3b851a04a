"""What ``notiflow dlq`` does besides reading: redaction, reveal, replay and purge.

Every action that changes or reveals something writes a ``dlq_audit`` row (who, when, what,
why); replay and purge also resolve the dead letter (``dlq_resolved``), so later reads hide
it. Replay semantics (docs/dlq.md): the original ingest record goes back to its ingest
topic with the same ``message_id`` and a fresh attempt number and retry budget
(``attempt = budget_base = highest attempt seen + 1``); a message that ended FAILED or
EXPIRED is reopened (QUEUED) first; an expired message is refused unless a new expiry is
given, and so is a message the provider already took, a suppressed one, and one whose
outcome is not recorded yet or that is still in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from notiflow.adapters.dlq import (
    LOOKUP_CHUNK,
    REOPEN_REASON,
    AuditRow,
    DlqEntry,
    DlqLedger,
    Found,
    MessageState,
    PartitionKey,
    ReadStats,
    dlq_topics,
    ingest_channels,
    offsets_at,
    read_dlq,
    resolved_of,
    selector_of,
    take,
    watermarks,
)
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.envelope import EnvelopeError, Sealer, dump, envelope, load
from notiflow.adapters.kafka_io import (
    AsyncProducer,
    DeliveryFailed,
    Headers,
    OutRecord,
    kafka_config,
    make_headers,
)
from notiflow.flows.common.items import SourceRef
from notiflow.flows.common.steps import complete_record, validation_reason
from notiflow.ingest_binding import HEADER, Verdict, binder, explain
from notiflow.redact import mask
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord
from notiflow.settings import Settings

MAX_ATTEMPT = 1000
REPLAY_HEADER = "dlq_replay_of"
ALREADY_SENT = frozenset({Status.PROVIDER_ACCEPTED, Status.SENT, Status.DELIVERED,
                          Status.OPENED, Status.CLICKED, Status.BOUNCED})
"""Statuses after which a replay would send the message a second time."""
REOPENABLE = frozenset({Status.FAILED, Status.EXPIRED})
"""Final statuses a replay sets back to QUEUED (the monotonic order would hide the new
attempt's statuses behind them)."""
IN_FLIGHT = frozenset({Status.PROCESSING, Status.RETRY_PENDING, Status.UNKNOWN})
STATUS_GRACE = timedelta(minutes=10)
"""How long after a dead letter that records provider attempts its message's final status
may still be on its way to Cassandra (the reconcile flow writes it)."""
RECIPIENT_KEYS = frozenset({"recipient", "to", "phone", "phone_number", "email",
                            "email_address", "address", "device_token", "token",
                            "registration_id"})
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_PHONE = re.compile(r"\+[1-9]\d{6,14}")
_HEX_TOKEN = re.compile(r"\b[0-9a-fA-F]{64,}\b")

Result = Literal["replayed", "would replay", "purged", "would purge", "refused", "failed",
                 "not found"]


def mask_text(text: str) -> str:
    """``text`` with every email address, E.164 number and APNs-like token masked."""
    text = _EMAIL.sub(lambda m: mask(m.group(0)), text)
    text = _PHONE.sub(lambda m: mask(m.group(0)), text)
    return _HEX_TOKEN.sub(lambda m: mask(m.group(0)), text)


def redact(value: Any, key: str | None = None) -> Any:
    """A JSON value with recipients masked: values under recipient-like keys (a push
    recipient's token too) and any address, number or token found in other strings."""
    if isinstance(value, dict):
        return {k: redact(v, k if isinstance(k, str) else None) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str):
        return mask(value) if key in RECIPIENT_KEYS and value else mask_text(value)
    return value


def payload_view(payload: bytes, reveal: bool, sealer: Sealer | None = None) -> Any:
    """A decrypted payload for display: parsed JSON when it is JSON, else text; recipients
    masked unless ``reveal``. Revealed, a sealed ingest record is opened with ``sealer``
    (left sealed when it does not open)."""
    try:
        doc: Any = orjson.loads(payload)
    except orjson.JSONDecodeError:
        doc = payload.decode(errors="replace")
    if not reveal:
        return redact(doc)
    if sealer is not None and isinstance(doc, dict):
        with contextlib.suppress(EnvelopeError):
            doc = sealer.open(doc)
    return doc


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def partition_key(record: IngestRecord) -> bytes:
    """The ingest key (docs/design.md, "Topics and keys"): ``message_id``, or
    ``tenant_id:ordering_key`` when set."""
    if record.ordering_key:
        return f"{record.tenant_id}:{record.ordering_key}".encode()
    return (record.message_id or "").encode()


@dataclass(frozen=True)
class ReplayPlan:
    """The record a replay produces, where, and why it looks the way it does."""

    entry: DlqEntry
    record: IngestRecord
    topic: str
    key: bytes
    headers: Headers
    previous_attempt: int
    extended_to: datetime | None
    dead_attempt: int
    """The attempt of the dead-lettered record."""

    @property
    def attempt(self) -> int:
        return self.record.attempt

    def detail(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "attempt": self.attempt, "budget_base": self.attempt,
            "previous_attempt": self.previous_attempt,
            "expires_at": self.record.expires_at.isoformat() if self.record.expires_at
            else None,
            "extended_ttl": self.extended_to is not None, **_where(self.entry),
        }


@dataclass(frozen=True)
class Refusal:
    why: str


def _where(entry: DlqEntry) -> dict[str, Any]:
    return {"dlq_topic": entry.topic, "dlq_partition": entry.partition,
            "dlq_offset": entry.offset}


def arrived_bound(dl: DlqRecord, payload: bytes, record: IngestRecord,
                  settings: Settings) -> Verdict:
    """Whether the dead letter's payload was bound to its tenant as it arrived (its original
    ``nf-binding`` header, for the channel and tier of its topic): a replay signs it for the
    platform, so it must not bind a record nobody had bound."""
    tiered = {settings.topic(f"ingest.{c.value.lower()}.{t.value.lower()}"): (c.value, t.value)
              for c in Channel for t in Tier}
    target = tiered.get(dl.source_topic, (record.channel.value, record.tier.value))
    raw = dl.headers.get(HEADER)
    return binder(settings).check(record.tenant_id, *target, payload,
                                  [(HEADER, raw.encode())] if raw is not None else None)


def plan_replay(entry: DlqEntry, payload: bytes, settings: Settings, *, now: datetime,
                seen_attempts: Iterable[int] = (),
                extend_ttl: timedelta | None = None) -> ReplayPlan | Refusal:
    """The replay of one dead letter, or why it cannot be replayed (pure).

    Only send requests (dead letters of an ingest topic whose payload is a valid ingest
    record of a known tenant, bound to it as it arrived: :func:`arrived_bound`) are
    replayable; the replay is bound by the platform key. The new record keeps ``message_id`` and the
    request; ``attempt`` and ``budget_base`` become one more than the highest attempt in the
    record, the dead letter's attempts and ``seen_attempts``; ``not_before``,
    ``avoid_provider``, ``provider_waits`` and ``unknown_check`` are cleared. An expired
    message is refused unless ``extend_ttl`` is given (new expiry: the later of the old one
    and now + ``extend_ttl``)."""
    dl = entry.record
    ingest = set(ingest_channels(settings)) | {settings.shared_topic}
    if dl.source_topic not in ingest:
        return Refusal(f"not a send request (dead-lettered from {dl.source_topic}); only "
                       "dead letters of ingest topics are replayed: inspect it with "
                       "`dlq show`, fix the cause, then purge it")
    try:
        record = load(payload, envelope(settings))
    except ValueError as exc:
        return Refusal(f"payload is not a valid ingest record ({validation_reason(exc)}): "
                       "the producer must send a corrected request; purge this one")
    if settings.tenant(record.tenant_id) is None:
        return Refusal(f"tenant {record.tenant_id!r} is not configured")
    verdict = arrived_bound(dl, payload, record, settings)
    if not verdict.bound:
        return Refusal(f"{explain(verdict, record.tenant_id)}; a replay would bind it to that "
                       "tenant: the producer must send it again, signed; purge this one")
    if record.message_id is None and dl.message_id:
        record = record.model_copy(update={"message_id": dl.message_id})
    source = SourceRef(dl.source_topic, dl.source_partition, dl.source_offset,
                       dl.source_timestamp_ms)
    record = complete_record(record, source, settings)
    assert record.expires_at is not None
    expires = record.expires_at
    if extend_ttl is not None:
        expires = max(expires, now + extend_ttl)
    elif expires <= now:
        return Refusal(f"message expired at {expires.isoformat()}; a replay would only end "
                       "EXPIRED (give --extend-ttl SECONDS to send it with a new expiry)")
    highest = max([record.attempt, record.unknown_check or 0,
                   *(a.attempt_no for a in dl.attempts), *seen_attempts])
    attempt = highest + 1
    if attempt > MAX_ATTEMPT:
        return Refusal(f"attempt {attempt} would exceed the limit of {MAX_ATTEMPT}")
    doc = record.model_dump(mode="json", exclude_none=True,
                            exclude={"not_before", "avoid_provider", "provider_waits",
                                     "unknown_check"})
    doc.update(attempt=attempt, budget_base=attempt, expires_at=expires.isoformat())
    try:
        fresh = IngestRecord.model_validate(doc)
    except ValidationError as exc:
        return Refusal(f"replayed record would be invalid ({validation_reason(exc)})")
    assert fresh.message_id is not None
    headers = make_headers(fresh.message_id, fresh.tenant_id, fresh.tier.value,
                           new_traceparent())
    headers.append((REPLAY_HEADER, dl.dlq_id.encode()))
    return ReplayPlan(entry, fresh, settings.ingest_topic(fresh.channel, fresh.tier),
                      partition_key(fresh), headers, highest,
                      expires if expires != record.expires_at else None, record.attempt)


def status_check(state: MessageState, dl: DlqRecord, dead_attempt: int,
                 now: datetime) -> Refusal | bool:
    """Whether the message's current status allows a replay (pure): a :class:`Refusal`, or
    whether the replay must reopen the message (True for FAILED and EXPIRED).

    Refused: the provider took the message (a replay would send it twice); it was
    SUPPRESSED or CANCELLED; an earlier replay is queued, or a later attempt than the
    dead-lettered one is in flight; or the dead letter records provider attempts, was
    written less than :data:`STATUS_GRACE` ago and the message's final status has not
    reached Cassandra yet (replaying before it lands would let that status hide the new
    attempt)."""
    st = state.status
    if st in ALREADY_SENT:
        return Refusal(f"message is already {st}: its provider took it, a replay would "
                       "send it twice")
    if st is Status.SUPPRESSED:
        return Refusal(f"message was SUPPRESSED ({state.reason}); a replay would be "
                       "suppressed again")
    if st is Status.CANCELLED:
        return Refusal("message was CANCELLED by its client; it must never be sent")
    if st in REOPENABLE:
        return True
    if st is Status.QUEUED and state.reason == REOPEN_REASON:
        return Refusal("an earlier replay of this message is queued: wait until it ends")
    if st in IN_FLIGHT and state.attempt >= dead_attempt:
        return Refusal(f"message is in flight ({st}, attempt {state.attempt}): wait until "
                       "it ends")
    if dl.attempts and now - dl.failed_at < STATUS_GRACE:
        return Refusal("the message's final status is not recorded yet (is `notiflow flow "
                       "reconcile` running?); try again shortly")
    return False


@dataclass(frozen=True)
class Outcome:
    """What an action did to one dead letter."""

    dlq_id: str
    message_id: str | None
    result: Result
    detail: str
    topic: str | None = None
    attempt: int | None = None


@dataclass
class DlqActions:
    """Reveal, replay and purge over one ledger (Cassandra) and, for replays, one confirming
    producer (acks=all; a record counts as replayed only once the broker acknowledged it)."""

    settings: Settings
    ledger: DlqLedger
    cipher: DlqCipher | None = None
    producer: AsyncProducer | None = None
    clock: Any = field(default=lambda: datetime.now(UTC))

    def tier_of(self, entry: DlqEntry) -> str:
        return selector_of(self.settings, entry.topic)

    async def reveal(self, entry: DlqEntry, actor: str, why: str) -> None:
        """Record that ``actor`` saw the clear payload (before it is shown)."""
        await self.ledger.audit(AuditRow(self.tier_of(entry), self.clock(), entry.dlq_id,
                                         "reveal", actor, why, entry.record.message_id,
                                         _where(entry)))

    async def replay(self, found: Found, *, actor: str, why: str, dry_run: bool = False,
                     again: bool = False, extend_ttl: timedelta | None = None) -> Outcome:
        """Replay one dead letter: refuse (nothing changes), or claim it, reopen its message
        if it ended FAILED/EXPIRED, produce the new record (broker-acknowledged), write the
        audit row and mark it replayed. A failed produce undoes the claim and the reopen."""
        entry, previous = found.entry, found.resolution
        dl = entry.record

        def refused(why_not: str) -> Outcome:
            return Outcome(dl.dlq_id, dl.message_id, "refused", why_not)

        if previous is not None and not again:
            return refused(f"already {previous.state} at {previous.at.isoformat()} by "
                           f"{previous.actor} (give --again to replay it anyway)")
        if self.cipher is None:
            raise RuntimeError("replay needs the DLQ key")
        try:
            payload = self.cipher.decrypt(dl.payload_encrypted)
        except ValueError as exc:
            return refused(f"{exc} (was NOTIFLOW_DLQ_KEY rotated?)")
        now = self.clock()
        message_id = _payload_message_id(payload) or dl.message_id
        state = (await self.ledger.message_state(message_id) if message_id
                 else MessageState(None, 0, 0, None, None, 0))
        seen = [state.highest_attempt]
        if previous is not None and previous.attempt:
            seen.append(previous.attempt)
        plan = plan_replay(entry, payload, self.settings, now=now, seen_attempts=seen,
                           extend_ttl=extend_ttl)
        if isinstance(plan, Refusal):
            return refused(plan.why)
        reopen = status_check(state, dl, plan.dead_attempt, now)
        if isinstance(reopen, Refusal):
            return refused(reopen.why)
        mid = plan.record.message_id
        assert mid is not None and plan.record.expires_at is not None
        summary = f"→ {plan.topic} attempt {plan.attempt}" + (
            f" (reopens {state.status})" if reopen else "")
        if dry_run:
            return Outcome(dl.dlq_id, mid, "would replay", summary, plan.topic, plan.attempt)
        detail = {**plan.detail(), "reopened_from": state.status.value
                  if reopen and state.status else None}
        if not await self.ledger.claim(entry.topic, dl.dlq_id, "replaying", now, actor, why,
                                       mid, plan.attempt, detail, previous=previous):
            return refused("resolved by someone else meanwhile")
        claimed = await self.ledger.resolution(entry.topic, dl.dlq_id)

        async def unclaim() -> None:
            if claimed is not None:
                await self.ledger.restore(entry.topic, dl.dlq_id, claimed, previous)

        if reopen and not await self.ledger.reopen(mid, state, attempt=plan.attempt,
                                                   expires_at=plan.record.expires_at, at=now,
                                                   dlq_id=dl.dlq_id):
            await unclaim()
            return refused("the message's status changed meanwhile; try again")
        assert self.producer is not None
        value = dump(plan.record, envelope(self.settings)).encode()
        try:
            await self.producer.produce(OutRecord(
                plan.topic, plan.key, value, binder(self.settings).sign(
                    plan.headers, plan.record.channel.value, plan.record.tier.value, value)))
        except DeliveryFailed as exc:
            if reopen:
                await self.ledger.undo_reopen(mid, state, attempt=plan.attempt,
                                              at=self.clock(), dlq_id=dl.dlq_id)
            await unclaim()
            return Outcome(dl.dlq_id, mid, "failed", f"not produced: {exc}")
        await self.ledger.audit(AuditRow(self.tier_of(entry), now, dl.dlq_id, "replay", actor,
                                         why, mid, {**detail, "again": previous is not None}))
        if claimed is not None:
            await self.ledger.claim(entry.topic, dl.dlq_id, "replayed", claimed.at, actor, why,
                                    mid, plan.attempt, detail, previous=claimed)
        return Outcome(dl.dlq_id, mid, "replayed", summary, plan.topic, plan.attempt)

    async def purge(self, found: Found, *, actor: str, why: str, dry_run: bool = False,
                    extra: Mapping[str, Any] | None = None) -> Outcome:
        """Resolve one dead letter as purged and write its audit row (the resolution is
        undone if the audit row cannot be written)."""
        entry = found.entry
        dl = entry.record
        if found.resolution is not None:
            return Outcome(dl.dlq_id, dl.message_id, "refused",
                           f"already {found.resolution.state}")
        if dry_run:
            return Outcome(dl.dlq_id, dl.message_id, "would purge", "")
        now = self.clock()
        detail = {**_where(entry), **(extra or {})}
        if not await self.ledger.claim(entry.topic, dl.dlq_id, "purged", now, actor, why,
                                       dl.message_id, None, detail):
            return Outcome(dl.dlq_id, dl.message_id, "refused",
                           "resolved by someone else meanwhile")
        try:
            await self.ledger.audit(AuditRow(self.tier_of(entry), now, dl.dlq_id, "purge",
                                             actor, why, dl.message_id, detail))
        except Exception:
            claimed = await self.ledger.resolution(entry.topic, dl.dlq_id)
            if claimed is not None:
                await self.ledger.restore(entry.topic, dl.dlq_id, claimed, None)
            raise
        return Outcome(dl.dlq_id, dl.message_id, "purged", "")


def _payload_message_id(payload: bytes) -> str | None:
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    mid = doc.get("message_id") if isinstance(doc, dict) else None
    return mid if isinstance(mid, str) else None


@dataclass(frozen=True)
class Truncation:
    """One partition of ``purge --before``: records ``[low, cut)`` are (to be) deleted."""

    topic: str
    partition: int
    low: int
    cut: int
    purged: int
    already_resolved: int


async def purge_before(actions: DlqActions, selector: str | None, before: datetime, *,
                       actor: str, why: str, dry_run: bool = False,
                       timeout: float = 30.0) -> list[Truncation]:
    """Resolve (purged, audited) every dead letter before the first offset whose Kafka
    timestamp is at or after ``before``, then delete those records from their partitions
    with ``delete_records`` (one ``delete_records`` audit row per partition). A later
    record with an older timestamp stays."""
    settings = actions.settings
    topics = list(dlq_topics(settings, selector).values())
    marks = await asyncio.to_thread(watermarks, settings, topics)
    cuts = await asyncio.to_thread(offsets_at, settings, topics, before)
    ranges: dict[PartitionKey, tuple[int, int]] = {
        k: (lo, cuts[k]) for k, (lo, _hi) in marks.items() if cuts.get(k, lo) > lo}
    counts: dict[PartitionKey, list[int]] = {k: [0, 0] for k in ranges}
    extra = {"deleted_before": before.isoformat()}
    records = read_dlq(settings, ranges, ReadStats())
    try:
        while True:
            chunk = await asyncio.to_thread(take, records, LOOKUP_CHUNK)
            if not chunk:
                break
            resolved = await resolved_of(actions.ledger, chunk)
            for e in chunk:
                out = await actions.purge(Found(e, None, resolved.get((e.topic, e.dlq_id))),
                                          actor=actor, why=why, dry_run=dry_run, extra=extra)
                counts[(e.topic, e.partition)][
                    0 if out.result in ("purged", "would purge") else 1] += 1
    finally:
        records.close()
    result = [Truncation(t, p, ranges[(t, p)][0], ranges[(t, p)][1], *counts[(t, p)])
              for t, p in sorted(ranges)]
    if dry_run or not result:
        return result
    admin = AdminClient(kafka_config(settings))
    futures = admin.delete_records([TopicPartition(t.topic, t.partition, t.cut)
                                    for t in result], request_timeout=timeout)
    for tp, fut in futures.items():
        try:
            await asyncio.to_thread(fut.result, timeout)
        except KafkaException as exc:
            raise RuntimeError(f"delete_records on {tp.topic}[{tp.partition}] failed: "
                               f"{exc}") from None
    now = actions.clock()
    for t in result:
        await actions.ledger.audit(AuditRow(
            selector_of(settings, t.topic), now, f"{t.topic}[{t.partition}]<{t.cut}",
            "delete_records", actor, why, None,
            {"dlq_topic": t.topic, "dlq_partition": t.partition, "from_offset": t.low,
             "to_offset": t.cut, **extra}))
    return result
