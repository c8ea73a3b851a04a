"""The send dataflow of one tier.

Recipe (``build_send_flow``)::

    ingest.{sms,email,push}.{tier}            Kafka, offsets in Bytewax recovery
      → parse                                 bad bytes / unknown tenant → DLQ record
      → hold (keyed by message_id)            retry backoff, scheduled_at: durable timers
      → send (per batch, async I/O)           dedup lease → expiry → content dedup
                                              → render template version → provider call
      → encode → confirming Kafka sink        notify.events, retries, notify.dlq.{tier}

Every outcome is data: a status event (PROVIDER_ACCEPTED, FAILED, EXPIRED, SUPPRESSED,
RETRY_PENDING), a retry record produced back to the ingest topic (held until due), or a DLQ
record. Progress is committed only after the sink confirmed every record.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import bytewax.operators as op
import orjson
from bytewax.dataflow import Dataflow
from bytewax.inputs import Source
from bytewax.outputs import Sink

from notiflow.adapters.bytewax_kafka import ConfirmingSink, check_topics, kafka_source
from notiflow.adapters.cassandra_store import CassandraStore, connect
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.providers.base import OutboundMessage, Outcome, ProviderClient, SendResult
from notiflow.adapters.redis_dedup import DedupStore
from notiflow.adapters.worker import WorkerLoop
from notiflow.flows.model import Out, Work, utcnow
from notiflow.flows.policy import RetryPolicy
from notiflow.flows.steps import (
    Clock,
    Encoder,
    Hold,
    IngestParser,
    dead_letter,
    is_expired,
    retry_record,
    scaled_lease_ttl,
    status_event,
)
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord, StatusEvent
from notiflow.schemas.status import rank
from notiflow.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

INFRA_RETRY_FOR = timedelta(seconds=60)


def content_fingerprint(work: Work) -> str:
    """Same recipient, channel, template, version and variables → same fingerprint (the
    tenant is part of the Redis key)."""
    r = work.record
    doc = orjson.dumps(
        [r.recipient_key(), r.channel.value, r.template_id, r.template_version, r.variables],
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(doc).hexdigest()


def lease_outcome(ev: StatusEvent) -> dict[str, object]:
    """What a finished lease records, so a replay can re-emit the outcome."""
    done: dict[str, object] = {"status": ev.status.value, "reason": ev.reason}
    if ev.attempt_detail is not None:
        done["detail"] = ev.attempt_detail.model_dump(mode="json")
    return done


def attempt_detail(work: Work, result: SendResult) -> AttemptRecord:
    return AttemptRecord(
        attempt_no=work.record.attempt,
        provider_id=result.provider_id,
        outcome=result.outcome.value,
        provider_message_id=result.provider_message_id,
        normalized_error=result.reason,
        error_code=result.error_code,
        retry_after_s=result.retry_after_s,
        started_at=result.started_at,
        completed_at=result.completed_at,
    )


async def open_providers(settings: Settings, tier: Tier) -> dict[Channel, ProviderClient]:
    """The provider client of each enabled channel (one per worker)."""
    providers: dict[Channel, ProviderClient] = {}
    timeout = settings.policy(tier).provider_timeout.total_seconds()
    if Channel.SMS in settings.enabled_channels():
        from notiflow.adapters.providers.twilio import TwilioSms

        providers[Channel.SMS] = await TwilioSms.open(settings, timeout=timeout)
    return providers


class _Closing:
    """Wraps a cassandra cluster so the worker runtime can shut it down."""

    def __init__(self, cluster: Any, store: CassandraStore) -> None:
        self.cluster = cluster
        self.store = store

    def shutdown(self) -> None:
        self.cluster.shutdown()


@dataclass(frozen=True, slots=True)
class RenderFailure:
    """The renderer broke an invariant (not a missing variable): a DLQ case, not FAILED."""

    reason: str


class SendStep:
    """``flat_map_batch`` mapper: a batch of :class:`Work` → status events, retries, DLQ."""

    def __init__(self, settings: Settings, tier: Tier, cipher: DlqCipher,
                 clock: Clock = utcnow, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.tier = tier
        self.cipher = cipher
        self.clock = clock
        self.rng = rng or random.Random()
        self.policy = settings.policy(tier)
        self.retry = RetryPolicy.for_tier(settings, tier)
        self.lease_ttl = scaled_lease_ttl(settings, tier)
        self.content_window = settings.scaled(settings.content_dedup_window)
        self.source = f"send.{tier.value.lower()}"
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.runtime = WorkerLoop()
        self._templates: dict[tuple[str, str, int], dict[str, Any] | None] = {}

    # ------------------------------------------------------------------ resources

    def _resources(self) -> tuple[DedupStore, CassandraStore, dict[Channel, ProviderClient]]:
        s = self.settings

        async def dedup() -> DedupStore:
            return DedupStore.open(s, self.owner)

        async def cassandra() -> _Closing:
            cluster, session = await asyncio.to_thread(connect, s)
            return _Closing(cluster, CassandraStore(session, s))

        async def providers() -> _ProviderSet:
            return _ProviderSet(await open_providers(s, self.tier))

        d = self.runtime.resource("dedup", dedup)
        c = self.runtime.resource("cassandra", cassandra)
        p = self.runtime.resource("providers", providers)
        return d, c.store, p.by_channel

    def __call__(self, batch: list[Work]) -> list[Out]:
        dedup, store, providers = self._resources()
        return self.runtime.run(self._process(batch, dedup, store, providers))

    def close(self) -> None:
        self.runtime.close()

    # --------------------------------------------------------------------- logic

    async def _infra(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """Retry an infrastructure call (Redis, Cassandra) with backoff; the worker waits
        (nothing is committed meanwhile) and gives up after ``INFRA_RETRY_FOR``."""
        delay = 0.2
        deadline = asyncio.get_running_loop().time() + INFRA_RETRY_FOR.total_seconds()
        while True:
            try:
                return await fn()
            except Exception as exc:
                if asyncio.get_running_loop().time() >= deadline:
                    raise RuntimeError(f"{what} unavailable for {INFRA_RETRY_FOR}") from exc
                log.warning("%s failed (%s); retrying in %.1fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _process(self, batch: list[Work], dedup: DedupStore, store: CassandraStore,
                       providers: dict[Channel, ProviderClient]) -> list[Out]:
        out: list[Out] = []
        keys = [dedup.lease_key(w.message_id, w.record.attempt) for w in batch]
        states = await self._infra("redis", lambda: dedup.acquire(keys, self.lease_ttl))
        now = self.clock()
        live: list[Work] = []
        for w, key, st in zip(batch, keys, states, strict=True):
            if st.acquired:
                live.append(w)
            elif (done := st.done) is not None:
                out.append(self._replayed(w, done, now))
            elif (owner := st.pending_owner()) is not None and owner != dedup.owner:
                holder = st.holder or ""
                if await self._infra("redis", lambda k=key, h=holder: dedup.take_over(
                        k, h, self.lease_ttl)):
                    log.warning("message %s attempt %s: resuming after a crashed sender "
                                "(possible duplicate)", w.message_id, w.record.attempt)
                    live.append(w)
        live = await self._drop_already_final(live, store)

        finished: list[tuple[str, dict[str, object]]] = []
        released: list[str] = []
        content_release: list[tuple[str, str]] = []

        def finish(w: Work, ev: StatusEvent, *, lease_recorded: bool = False) -> None:
            out.append(ev)
            if not lease_recorded:
                finished.append((dedup.lease_key(w.message_id, w.record.attempt),
                                 lease_outcome(ev)))

        sendable: list[Work] = []
        for w in live:
            if is_expired(w, now):
                finish(w, status_event(w, Status.EXPIRED, now, self.source, reason="ttl"))
            else:
                sendable.append(w)

        fresh = [w for w in sendable if w.record.idempotency_key is None]
        claims = [(dedup.content_key(w.record.tenant_id, content_fingerprint(w)), w.message_id)
                  for w in fresh]
        holders = await self._infra("redis", lambda: dedup.claim_content(
            claims, self.content_window))
        suppressed = {w.message_id for w, h in zip(fresh, holders, strict=True) if h}
        for w, h in zip(fresh, holders, strict=True):
            if h:
                finish(w, status_event(w, Status.SUPPRESSED, now, self.source,
                                       reason=f"duplicate_content_of:{h}"))
        sendable = [w for w in sendable if w.message_id not in suppressed]
        owns_content = {w.message_id: key for w, (key, _) in zip(fresh, claims, strict=True)
                        if w.message_id not in suppressed}

        rendered = await self._render(sendable, store)
        calls: list[tuple[Work, OutboundMessage, ProviderClient]] = []
        for w in sendable:
            msg_or_err = rendered[w.message_id]
            if isinstance(msg_or_err, RenderFailure):
                out.append(dead_letter(
                    raw=w.raw, source=w.source, reason=f"renderer failed: {msg_or_err.reason}",
                    error_class="render_error", category="bug", tier=self.tier,
                    cipher=self.cipher, now=now, message_id=w.message_id,
                    tenant_id=w.record.tenant_id, headers=w.headers))
                released.append(dedup.lease_key(w.message_id, w.record.attempt))
                continue
            if isinstance(msg_or_err, str):
                finish(w, status_event(w, Status.FAILED, now, self.source, reason=msg_or_err))
                if w.message_id in owns_content:
                    content_release.append((owns_content[w.message_id], w.message_id))
                continue
            provider = providers.get(w.record.channel)
            if provider is None:
                out.append(dead_letter(
                    raw=w.raw, source=w.source, reason=f"no provider for {w.record.channel}",
                    error_class="channel_unavailable", category="unavailable", tier=self.tier,
                    cipher=self.cipher, now=now, message_id=w.message_id,
                    tenant_id=w.record.tenant_id, headers=w.headers))
                released.append(dedup.lease_key(w.message_id, w.record.attempt))
                continue
            calls.append((w, msg_or_err, provider))

        sem = asyncio.Semaphore(self.policy.max_in_flight)

        async def call(w: Work, provider: ProviderClient,
                       msg: OutboundMessage) -> tuple[SendResult, StatusEvent | None]:
            """One provider call; an acceptance is recorded on the lease at once, so a crash
            later in the batch cannot make a replay send it again."""
            async with sem:
                try:
                    result = await provider.send(msg)
                except Exception as exc:
                    log.error("provider call raised for %s: %r", w.message_id, exc)
                    at = self.clock()
                    result = SendResult(Outcome.TRANSIENT, provider.provider_id, at, at,
                                        reason=f"internal_error:{type(exc).__name__}")
            if result.outcome is not Outcome.ACCEPTED:
                return result, None
            ev = status_event(w, Status.PROVIDER_ACCEPTED, result.completed_at, self.source,
                              detail=attempt_detail(w, result))
            key = dedup.lease_key(w.message_id, w.record.attempt)
            await self._infra("redis", lambda: dedup.finish([(key, lease_outcome(ev))],
                                                            self.lease_ttl))
            return result, ev

        results = await asyncio.gather(*(call(w, p, m) for w, m, p in calls))
        for (w, _, _), (result, accepted) in zip(calls, results, strict=True):
            done_at = result.completed_at
            if accepted is not None:
                finish(w, accepted, lease_recorded=True)
                continue
            detail = attempt_detail(w, result)
            key = dedup.lease_key(w.message_id, w.record.attempt)
            if result.outcome is Outcome.PERMANENT:
                finish(w, status_event(w, Status.FAILED, done_at, self.source,
                                       reason=result.reason, detail=detail))
                if w.message_id in owns_content:
                    content_release.append((owns_content[w.message_id], w.message_id))
                continue
            retry_after = (timedelta(seconds=result.retry_after_s)
                           if result.retry_after_s else None)
            assert w.record.expires_at is not None
            decision = self.retry.after_failure(w.record.attempt, done_at, w.record.expires_at,
                                                retry_after, self.rng)
            if decision.next_attempt is not None and decision.next_attempt_at is not None:
                out.append(status_event(w, Status.RETRY_PENDING, done_at, self.source,
                                        reason=result.reason, detail=detail,
                                        next_attempt_at=decision.next_attempt_at))
                out.append(retry_record(w, decision.next_attempt, decision.next_attempt_at))
                released.append(key)
                continue
            status = Status.EXPIRED if decision.give_up == "expires_before_retry" else (
                Status.FAILED)
            finish(w, status_event(w, status, done_at, self.source,
                                   reason=decision.give_up, detail=detail))
            if w.message_id in owns_content:
                content_release.append((owns_content[w.message_id], w.message_id))
            if (result.reason or "").startswith("internal_error"):
                out.append(self._unexplained(w, detail, done_at))

        await self._infra("redis", lambda: dedup.finish(finished, self.lease_ttl))
        await self._infra("redis", lambda: dedup.release(released))
        await self._infra("redis", lambda: dedup.release_content(content_release))
        return out

    def _replayed(self, w: Work, done: dict[str, Any], now: datetime) -> StatusEvent:
        """A record seen again after its attempt ended: re-emit the recorded outcome (the
        event may not have reached Kafka before a crash); never call the provider again."""
        detail = AttemptRecord.model_validate(done["detail"]) if done.get("detail") else None
        return status_event(w, Status(str(done["status"])), now, self.source,
                            reason=done.get("reason"), detail=detail)

    async def _drop_already_final(self, live: list[Work],
                                  store: CassandraStore) -> list[Work]:
        """A lease can only have expired for an old record: ask Cassandra whether the message
        already ended before sending it again."""
        now = self.clock()
        old = [w for w in live if now - w.accepted_at > self.lease_ttl]
        if not old:
            return live
        rows = await self._infra("cassandra", lambda: asyncio.gather(
            *(store.get_message(w.message_id) for w in old)))
        final = {w.message_id for w, row in zip(old, rows, strict=True)
                 if row and row.get("status_rank", 0) >= rank(Status.SUPPRESSED)}
        return [w for w in live if w.message_id not in final]

    async def _render(self, batch: list[Work], store: CassandraStore
                      ) -> dict[str, OutboundMessage | str | RenderFailure]:
        """message_id → rendered message, the FAILED reason, or a renderer failure."""
        from notiflow.templating import MissingVariable, RenderError, render

        wanted = {(w.record.tenant_id, w.record.template_id, w.record.template_version)
                  for w in batch} - self._templates.keys()
        if wanted:
            keys = sorted(wanted)
            rows = await self._infra("cassandra", lambda: asyncio.gather(
                *(store.get_template(*k) for k in keys)))
            for k, row in zip(keys, rows, strict=True):
                if row is not None:
                    self._templates[k] = row
        result: dict[str, OutboundMessage | str | RenderFailure] = {}
        for w in batch:
            r = w.record
            tpl = self._templates.get((r.tenant_id, r.template_id, r.template_version))
            if tpl is None:
                result[w.message_id] = "unknown_template"
                continue
            if tpl["channel"] != r.channel.value:
                result[w.message_id] = "template_channel_mismatch"
                continue
            try:
                subject, body = render(tpl, r.variables)
            except MissingVariable as exc:
                result[w.message_id] = f"missing_template_variable:{exc.name}"
                continue
            except RenderError as exc:
                result[w.message_id] = RenderFailure(str(exc))
                continue
            result[w.message_id] = OutboundMessage(
                message_id=w.message_id, attempt=r.attempt, tenant_id=r.tenant_id,
                channel=r.channel, tier=r.tier, recipient=r.recipient, body=body,
                subject=subject)
        return result

    def _unexplained(self, w: Work, detail: AttemptRecord, now: datetime) -> DlqRecord:
        return dead_letter(raw=w.raw, source=w.source, reason="retries exhausted after "
                           f"unexplained failures ({detail.normalized_error})",
                           error_class="exhausted_unexplained", category="bug",
                           tier=self.tier, cipher=self.cipher, now=now,
                           message_id=w.message_id, tenant_id=w.record.tenant_id,
                           headers=w.headers, attempts=(detail,))


class _ProviderSet:
    def __init__(self, by_channel: dict[Channel, ProviderClient]) -> None:
        self.by_channel = by_channel

    async def aclose(self) -> None:
        for p in self.by_channel.values():
            await p.aclose()


def build_send_flow(
    settings: Settings,
    tier: Tier,
    *,
    source: Source[Any] | None = None,
    sink: Sink[OutRecord] | None = None,
    clock: Clock = utcnow,
    rng: random.Random | None = None,
) -> Dataflow:
    """The send dataflow of ``tier``; ``source``/``sink`` default to Kafka."""
    cipher = DlqCipher.from_settings(settings)
    policy = settings.policy(tier)
    topics = [settings.ingest_topic(c, tier) for c in Channel]
    if source is None:
        check_topics(settings, topics)
    flow = Dataflow(f"send-{tier.value.lower()}")

    raw = op.input("ingest", flow, source or kafka_source(settings, topics, policy.batch_size))
    parsed = op.map("parse", raw, IngestParser(settings, tier, cipher, clock))
    split = op.branch("is-work", parsed, lambda x: isinstance(x, Work))
    errors = split.falses

    timing = op.branch("due-now", split.trues, lambda w: w.is_due(clock()))
    held = op.stateful("hold", op.key_on("by-message", timing.falses, lambda w: w.message_id),
                       lambda resume: Hold(resume, clock))
    ready = op.merge("ready", timing.trues, op.key_rm("unkey", held))

    sent = op.flat_map_batch("send", ready, SendStep(settings, tier, cipher, clock, rng))
    records = op.map("encode", op.merge("outputs", sent, errors), Encoder(settings))
    op.output("kafka-out", records, sink or ConfirmingSink(settings))
    return flow
