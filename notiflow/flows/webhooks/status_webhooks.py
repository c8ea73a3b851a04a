"""The client status webhook dataflow: signed POSTs to each message's ``status_webhook``.

Recipe (``build_webhook_flow``)::

    notify.events + notify.receipts   Kafka, offsets in this flow's own recovery store; the
                                      source pauses while the process's sender is saturated
      → parse                         StatusEvent / Receipt → StatusChange; records that do
                                      not decode are skipped (the reconciler dead-letters
                                      them); events whose snapshot has no webhook are dropped
      → fresh                         changes older than the whole schedule that were read
                                      as history (appended before the flow first read their
                                      partition: a replay from offset 0) are skipped; older
                                      ones read live go on, to the DLQ (``webhook_age.py``)
      → resolve (per batch)           tenant + URL from the event's snapshot, else from
                                      Cassandra ``messages`` (receipts without a message id:
                                      through the provider message index), cached per process
      → deliver (keyed by message_id) WebhookLogic: one webhook per status change with a
                                      stable webhook-id, in status order, retried on the
                                      scaled schedule by timers; a circuit breaker per
                                      tenant and endpoint (waiting while open spends no
                                      attempt); POSTs
                                      run on the process's WebhookDispatcher (own event loop)
      → encode → confirming Kafka sink   given-up and too-old webhooks → notify.dlq.webhooks

The items are in ``webhook_items.py``, resolution in ``webhook_resolve.py``, the POSTs'
runtime in ``webhook_sender.py``; this module holds the policy and the per-message logic.

The pending webhooks of a message (attempt counts and due times) are the state of its key,
so a pending retry survives a crash; a POST in flight at a crash is sent again after the
restart with the same webhook-id (at-least-once; clients dedup by it).
"""

from __future__ import annotations

import concurrent.futures
import copy
import logging
import random
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import bytewax.operators as op
import orjson
from bytewax.connectors.kafka import KafkaError
from bytewax.dataflow import Dataflow
from bytewax.inputs import Source
from bytewax.operators import StatefulLogic
from bytewax.outputs import Sink
from opentelemetry import metrics
from pydantic import SecretStr, ValidationError

from notiflow import names
from notiflow.adapters.bytewax_kafka import (
    ConfirmingSink,
    PausableKafkaSource,
    kafka_source,
)
from notiflow.adapters.client_webhooks import (
    AttemptResult,
    Verdict,
    decode_secret,
    endpoint_id,
    status_body,
    webhook_id,
)
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.egress import Refusal, check_url
from notiflow.flows.common.items import SourceRef, utcnow
from notiflow.flows.common.steps import Clock, RawMessage, source_of
from notiflow.flows.common.toolbox import guard_and_emit
from notiflow.flows.webhooks.webhook_age import Fresh, HistorySource, is_history, too_old
from notiflow.flows.webhooks.webhook_items import StatusChange, WebhookJob
from notiflow.flows.webhooks.webhook_resolve import Resolver
from notiflow.flows.webhooks.webhook_sender import (
    OUTCOME,
    Refused,
    Request,
    Result,
    Sender,
    WebhookDispatcher,
    breaker_id,
)
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord, Receipt, StatusEvent
from notiflow.secrets import Keyring
from notiflow.settings import Settings
from notiflow.telemetry import header_traceparent

log = logging.getLogger("notiflow.flows.client_webhooks")
_meter = metrics.get_meter(names.METER)
_deliveries = names.CLIENT_WEBHOOK_DELIVERIES.create(_meter)
_dlq_records = names.DLQ_RECORDS.create(_meter)

POLL = timedelta(milliseconds=20)
"""How often a key with a POST in flight looks for its result."""
MIN_WAIT = timedelta(milliseconds=20)
"""Shortest wait before asking a refusing breaker again."""
JITTER = 0.1
"""Each wait is its nominal length plus up to this share of it (never less)."""
ORDER_MEMORY = timedelta(hours=1)
"""How long a message's finished statuses are remembered after its last webhook (so a late
lower status is not sent after a higher one, and a replay is not sent twice); scaled, at
least ``MIN_MEMORY``."""
MIN_MEMORY = timedelta(seconds=30)
MIN_SPAN = timedelta(minutes=10)
"""Floor of ``max_age`` and of the patience with an open breaker (tiny test schedules)."""


def parse_change(msg: RawMessage, receipts_topic: str) -> StatusChange | None:
    """A Kafka record → :class:`StatusChange`; None when it cannot announce anything."""
    if isinstance(msg, KafkaError):
        log.warning("kafka error in the webhook flow's source: %s", msg.err)
        return None
    if not msg.value:
        return None
    src = source_of(msg)
    try:
        if src.topic == receipts_topic:
            r = Receipt.model_validate_json(msg.value)
            return StatusChange(r.message_id, Status(r.status), r.attempt or 0, r.error_code,
                                r.occurred_at, src,
                                provider_ref=(r.provider_id, r.provider_message_id),
                                traceparent=header_traceparent(msg.headers),
                                history=is_history(msg.headers))
        ev = StatusEvent.model_validate_json(msg.value)
    except ValidationError:
        return None
    snap = ev.message
    if snap is not None and not snap.status_webhook:
        return None
    return StatusChange(ev.message_id, ev.status, ev.attempt, ev.reason, ev.occurred_at, src,
                        tenant_id=ev.tenant_id, tier=ev.tier,
                        url=snap.status_webhook if snap else None, resolved=snap is not None,
                        traceparent=header_traceparent(msg.headers),
                        history=is_history(msg.headers))


# policy ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """``ClientWebhookRule`` at the settings' ``time_scale``: ``delays[i]`` is the wait
    before attempt ``i + 1`` (the first is normally 0)."""

    delays: tuple[timedelta, ...]
    timeout: timedelta
    memory: timedelta
    max_age: timedelta
    """Older changes are not announced (``webhook_age.py``: skipped as history, else
    dead-lettered)."""
    patience: timedelta
    """How long after its first try a webhook may wait on an open breaker before the DLQ."""
    park_for: timedelta
    """How long a change with an unknown URL waits for its message to become known."""
    statuses: frozenset[str] = frozenset()
    """Statuses announced (empty = all)."""
    jitter: float = JITTER

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookPolicy:
        rule = settings.client_webhooks
        delays = tuple(settings.scaled(d) for d in rule.schedule) or (timedelta(0),)
        span = sum(delays, timedelta(0))
        return cls(delays=delays, timeout=rule.timeout,
                   memory=max(settings.scaled(ORDER_MEMORY), MIN_MEMORY),
                   max_age=max(span, MIN_SPAN), patience=max(2 * span, MIN_SPAN),
                   park_for=settings.scaled(settings.receipt_park_for),
                   statuses=frozenset(s.upper() for s in rule.statuses))

    @property
    def attempts(self) -> int:
        return len(self.delays)

    @property
    def span(self) -> timedelta:
        """From the first due time to the last attempt, without jitter."""
        return sum(self.delays, timedelta(0))

    @property
    def longest(self) -> timedelta:
        return max(self.delays)

    def announces(self, status: Status) -> bool:
        return not self.statuses or status.value in self.statuses

    def delay(self, attempts_made: int, rng: random.Random,
              retry_after_s: float | None = None) -> timedelta:
        """Wait after ``attempts_made`` failed attempts: the scheduled delay plus jitter; a
        longer ``Retry-After`` wins, up to the longest step of the schedule."""
        base = self.delays[attempts_made]
        wait = base * (1 + self.jitter * rng.random())
        if retry_after_s:
            wait = max(wait, min(timedelta(seconds=retry_after_s), self.longest))
        return wait


def tenant_secrets(settings: Settings, tenant_id: str) -> tuple[SecretStr, ...]:
    """The tenant's signing secrets (every one signs); ``ValueError`` when the tenant is
    unknown, has none, or one does not decode."""
    tenant = settings.tenant(tenant_id)
    if tenant is None:
        raise ValueError(f"unknown tenant {tenant_id!r}")
    if not tenant.webhook_secrets:
        raise ValueError(f"tenant {tenant_id!r} has no webhook secret")
    for s in tenant.webhook_secrets:
        decode_secret(s)
    return tenant.webhook_secrets




@dataclass
class Pending:
    """One webhook still to deliver."""

    webhook_id: str
    status: Status
    rank: int
    url: str
    endpoint: str
    tenant_id: str
    message_id: str
    body: bytes
    source: SourceRef
    tier: Tier | None
    due_at: datetime
    deadline: datetime | None = None
    """Set at the first try: waiting on an open breaker ends here (DLQ), never forever."""
    tries: int = 0
    attempts: list[AttemptRecord] = field(default_factory=list)
    traceparent: str | None = None


@dataclass
class Waiting:
    """A change whose message's URL is not known yet, kept until ``until``."""

    job: WebhookJob
    until: datetime


@dataclass
class WebhookState:
    """The state of one message's key: its pending webhooks (ascending status rank), the
    highest rank finished (delivered or given up) and every finished rank, when to forget
    them, the message's (tenant, URL) once known, and changes waiting for it."""

    pending: list[Pending] = field(default_factory=list)
    cursor: int = -1
    finished: set[int] = field(default_factory=set)
    forget_at: datetime | None = None
    target: tuple[str, str] | None = None
    waiting: list[Waiting] = field(default_factory=list)


DlqCategory = Literal["invalid_data", "provider_outage", "bug", "unavailable"]
GiveUp = tuple[str, DlqCategory, str]
"""(error_class, category, reason) of a DLQ record."""


class WebhookLogic(StatefulLogic[WebhookJob, DlqRecord, WebhookState]):
    """Keyed by message_id. Delivers one webhook per status change (per attempt for
    PROCESSING, RETRY_PENDING, UNKNOWN), lowest status rank first and one at a time, so a
    client never sees a message's status go backwards: a change whose rank is not above the
    highest finished one is not sent (a duplicate, or superseded; logged). Failed attempts
    wait the scheduled delay (timers; the state holds due times and attempt counts). A
    refusing breaker delays the attempt without spending it, up to ``policy.patience``
    after the first try. After the last attempt, a 410, or a configuration error (unknown
    tenant, no secret, bad URL, a URL the egress rules refuse when queued or when vetted
    before a POST) → a DLQ record; so is a change older than ``policy.max_age`` when it is
    queued (``webhook_stale``: never POSTed late). Changes without a URL wait up to
    ``policy.park_for`` for a change of the same message that carries it."""

    def __init__(self, resume: WebhookState | None, *, sender: Sender, settings: Settings,
                 policy: WebhookPolicy, cipher: DlqCipher, clock: Clock = utcnow,
                 rng: random.Random | None = None, eof_timeout: float = 60.0,
                 keyring: Keyring | None = None) -> None:
        """``keyring``: where the tenants' signing secrets in force are read (the process's,
        reloaded from ``NOTIFLOW_SECRETS_DIR``); default: ``settings`` as they are."""
        self.st = resume or WebhookState()
        self.sender = sender
        self.settings = settings
        self.keyring = keyring or Keyring(settings)
        self.policy = policy
        self.cipher = cipher
        self.clock = clock
        self.rng = rng or random.Random()
        self.eof_timeout = eof_timeout
        self.inflight: tuple[str, concurrent.futures.Future[Result]] | None = None

    # bytewax interface

    def on_item(self, value: WebhookJob) -> tuple[Iterable[DlqRecord], bool]:
        now = self.clock()
        outs = self._add(value, now)
        outs += self._advance(now)
        return outs, self._keep(now)

    def on_notify(self) -> tuple[Iterable[DlqRecord], bool]:
        now = self.clock()
        return self._advance(now), self._keep(now)

    def on_eof(self) -> tuple[Iterable[DlqRecord], bool]:
        """Finite input (tests): keep delivering what is pending for up to ``eof_timeout``
        seconds (timers do not fire after EOF)."""
        deadline = time.monotonic() + self.eof_timeout
        outs: list[DlqRecord] = []
        while (self.inflight is not None or self.st.pending) and time.monotonic() < deadline:
            if self.inflight is not None:
                concurrent.futures.wait([self.inflight[1]],
                                        timeout=max(0.0, deadline - time.monotonic()))
            outs += self._advance(self.clock())
            if self.inflight is None and self.st.pending:
                wait = (self.st.pending[0].due_at - self.clock()).total_seconds()
                time.sleep(max(0.0, min(wait, deadline - time.monotonic())))
        return outs, self._keep(self.clock())

    def notify_at(self) -> datetime | None:
        st = self.st
        if self.inflight is not None:
            return self.clock() + POLL
        times = [w.until for w in st.waiting]
        if st.pending:
            times.append(st.pending[0].due_at)
        return min(times) if times else st.forget_at

    def snapshot(self) -> WebhookState:
        return copy.deepcopy(self.st)

    # internals

    def _keep(self, now: datetime) -> bool:
        st = self.st
        if (self.inflight is not None or st.pending or st.waiting
                or (st.forget_at and now < st.forget_at)):
            return StatefulLogic.RETAIN
        return StatefulLogic.DISCARD

    def _add(self, job: WebhookJob, now: datetime) -> list[DlqRecord]:
        st = self.st
        if job.url is None or job.tenant_id is None:
            if st.target is None:
                st.waiting.append(Waiting(job, now + self.policy.park_for))
                return []
            return self._queue(job, st.target, now)
        outs: list[DlqRecord] = []
        if st.target is None:
            st.target = (job.tenant_id, job.url)
            waiting, st.waiting = st.waiting, []
            for w in waiting:
                outs += self._queue(w.job, st.target, now)
        return outs + self._queue(job, (job.tenant_id, job.url), now)

    def _queue(self, job: WebhookJob, target: tuple[str, str],
               now: datetime) -> list[DlqRecord]:
        st = self.st
        if not self.policy.announces(job.status):
            return []
        r = job.rank
        if r in st.finished or any(p.rank == r for p in st.pending):
            return []
        if r <= st.cursor:
            log.info("not announcing %s of %s: a later status was already announced",
                     job.status.value, job.message_id)
            return []
        st.forget_at = now + self.policy.memory
        tenant_id, url = target
        body = status_body(message_id=job.message_id, status=job.status, reason=job.reason,
                           attempt=job.attempt, occurred_at=job.occurred_at,
                           tenant_id=tenant_id)
        problem: tuple[str, str] | None = None
        try:
            endpoint = endpoint_id(url)
        except ValueError as exc:
            endpoint, problem = "invalid", ("webhook_invalid_url", str(exc))
        else:
            refusal = check_url(url, self.settings.egress)
            if isinstance(refusal, Refusal):
                problem = ("webhook_url_not_allowed", refusal.detail)
        p = Pending(webhook_id(job.message_id, job.status, job.attempt), job.status, r, url,
                    endpoint, tenant_id, job.message_id, body, job.source, job.tier,
                    due_at=now + self.policy.delays[0],
                    traceparent=getattr(job, "traceparent", None))
        if problem is None:
            try:
                tenant_secrets(self.keyring.settings, tenant_id)
            except ValueError as exc:
                problem = ("webhook_no_secret", str(exc))
        if problem is not None:
            st.finished.add(r)
            return [self._dlq(p, now, problem[0], "invalid_data", problem[1])]
        if too_old(job.occurred_at, now, self.policy.max_age):
            st.finished.add(r)
            age = int((now - job.occurred_at).total_seconds())
            return [self._dlq(p, now, "webhook_stale", "unavailable", (
                f"status change {age} s old when queued, beyond the "
                f"{int(self.policy.max_age.total_seconds())} s the retry schedule covers; "
                "not announced late"))]
        st.pending.append(p)
        st.pending.sort(key=lambda x: x.rank)
        return []

    def _advance(self, now: datetime) -> list[DlqRecord]:
        outs: list[DlqRecord] = []
        if self.inflight is not None and self.inflight[1].done():
            outs += self._complete(now)
        self._expire(now)
        while self.inflight is None and self.st.pending and self.st.pending[0].due_at <= now:
            outs += self._submit(self.st.pending[0], now)
        return outs

    def _expire(self, now: datetime) -> None:
        st = self.st
        for w in [w for w in st.waiting if w.until <= now]:
            log.warning("not announcing %s of %s: no message row and no event with its "
                        "webhook URL within %s", w.job.status.value, w.job.message_id,
                        self.policy.park_for)
        st.waiting = [w for w in st.waiting if w.until > now]

    def _submit(self, p: Pending, now: datetime) -> list[DlqRecord]:
        try:
            secrets = tenant_secrets(self.keyring.settings, p.tenant_id)
        except ValueError as exc:
            return self._finish(p, now, ("webhook_no_secret", "invalid_data", str(exc)))
        if p.deadline is None:
            p.deadline = now + self.policy.patience
        attrs = {names.ATTR_MESSAGE_ID: p.message_id, names.ATTR_TENANT_ID: p.tenant_id,
                 names.ATTR_STATUS: p.status.value, names.ATTR_ATTEMPT: p.tries + 1}
        fut = self.sender.submit(Request(p.endpoint, p.url, p.webhook_id, p.body, secrets,
                                         getattr(p, "traceparent", None), attrs,
                                         tenant_id=p.tenant_id))
        self.inflight = (p.webhook_id, fut)
        return []

    def _complete(self, now: datetime) -> list[DlqRecord]:
        assert self.inflight is not None
        wid, fut = self.inflight
        self.inflight = None
        p = next((x for x in self.st.pending if x.webhook_id == wid), None)
        if p is None:
            return []
        try:
            res = fut.result()
        except Exception as exc:
            res = AttemptResult(Verdict.RETRY, f"internal_error:{type(exc).__name__}", now, now)
        if isinstance(res, Refused):
            if p.deadline is not None and now >= p.deadline:
                return self._finish(p, now, (
                    "webhook_exhausted", "unavailable",
                    f"endpoint circuit breaker still open after {p.tries} attempts"))
            wait = max(timedelta(seconds=res.retry_in), MIN_WAIT)
            p.due_at = now + wait * (1 + self.policy.jitter * self.rng.random())
            return []
        if res.verdict is Verdict.REFUSED:
            return self._finish(p, now, ("webhook_url_not_allowed", "invalid_data",
                                         f"the egress rules refuse the URL ({res.reason})"))
        p.tries += 1
        p.attempts.append(AttemptRecord(
            attempt_no=p.tries, provider_id=p.endpoint, outcome=OUTCOME[res.verdict],
            normalized_error=None if res.verdict is Verdict.DELIVERED else res.reason,
            error_code=str(res.status_code) if res.status_code is not None else None,
            retry_after_s=res.retry_after_s, started_at=res.started_at,
            completed_at=res.completed_at))
        if res.verdict is Verdict.DELIVERED:
            _deliveries.add(1, {"outcome": "delivered"})
            return self._finish(p, now)
        _deliveries.add(1, {"outcome": "failed"})
        if res.verdict is Verdict.GONE:
            return self._finish(p, now, ("webhook_gone", "invalid_data",
                                         "endpoint answered 410 Gone"))
        if p.tries >= self.policy.attempts:
            return self._finish(p, now, (
                "webhook_exhausted", "unavailable",
                f"{p.tries} attempts failed over the schedule; last: {res.reason}"))
        p.due_at = now + self.policy.delay(p.tries, self.rng, res.retry_after_s)
        return []

    def _finish(self, p: Pending, now: datetime,
                dlq: GiveUp | None = None) -> list[DlqRecord]:
        st = self.st
        st.pending = [x for x in st.pending if x is not p]
        st.finished.add(p.rank)
        st.cursor = max(st.cursor, p.rank)
        for x in st.pending:
            if x.rank <= st.cursor:
                log.info("not announcing %s of %s: a later status was already announced",
                         x.status.value, x.message_id)
        st.pending = [x for x in st.pending if x.rank > st.cursor]
        st.forget_at = now + self.policy.memory
        return [] if dlq is None else [self._dlq(p, now, *dlq)]

    def _dlq(self, p: Pending, now: datetime, error_class: str, category: DlqCategory,
             reason: str) -> DlqRecord:
        """A dead letter whose id depends only on the webhook and how it ended, so the
        re-emission of an epoch that did not commit yields the same record."""
        _deliveries.add(1, {"outcome": "dead"})
        payload = orjson.dumps({"url": p.url, "webhook_id": p.webhook_id,
                                "body": p.body.decode()})
        dlq_id = uuid.uuid5(uuid.NAMESPACE_URL,
                            f"notiflow:{p.webhook_id}:{error_class}:{p.tries}").hex
        return DlqRecord(
            dlq_id=dlq_id, tier=p.tier, reason=reason, error_class=error_class,
            category=category, failed_at=now, source_topic=p.source.topic,
            source_partition=p.source.partition, source_offset=p.source.offset,
            source_timestamp_ms=p.source.timestamp_ms, message_id=p.message_id,
            tenant_id=p.tenant_id,
            headers={"webhook_id": p.webhook_id, "status": p.status.value,
                     "endpoint": p.endpoint},
            payload_encrypted=self.cipher.encrypt(payload), attempts=tuple(p.attempts))


class DlqEncoder:
    """DLQ records → ``notify.dlq.webhooks`` (key = message_id)."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.webhooks_dlq_topic

    def __call__(self, rec: DlqRecord) -> OutRecord:
        _dlq_records.add(1, {"dlq": "webhooks", "category": rec.category,
                             "error_class": rec.error_class})
        return OutRecord(self.topic, (rec.message_id or rec.dlq_id).encode(),
                         rec.model_dump_json(exclude_none=True).encode(),
                         make_headers(rec.message_id or "", rec.tenant_id,
                                      rec.tier.value if rec.tier else None))


def build_webhook_flow(
    settings: Settings,
    *,
    source: Source[Any] | None = None,
    sink: Sink[OutRecord] | None = None,
    clock: Clock = utcnow,
    sender: Sender | None = None,
    receipts: bool = True,
    rng: random.Random | None = None,
    eof_timeout: float = 60.0,
    keyring: Keyring | None = None,
) -> Dataflow:
    """The client webhook dataflow over ``notify.events`` (and ``notify.receipts`` unless
    ``receipts`` is False); ``source``/``sink`` default to Kafka, ``sender`` to this
    process's :class:`WebhookDispatcher` (started when the flow runs); ``eof_timeout``: how
    long a finite input (tests) keeps delivering after its end; ``keyring``: the tenants'
    signing secrets in force (default: ``settings``'s, reloaded by the dispatcher from
    ``NOTIFLOW_SECRETS_DIR``)."""
    cipher = DlqCipher.from_settings(settings)
    policy = WebhookPolicy.from_settings(settings)
    topics = [settings.events_topic, *([settings.receipts_topic] if receipts else [])]
    keyring = keyring or Keyring(settings)
    out = sender or WebhookDispatcher(settings, keyring=keyring)
    flow = Dataflow("client-webhooks")
    raw = op.input("events", flow, source or HistorySource(PausableKafkaSource(
        kafka_source(settings, topics, 500, require=[settings.webhooks_dlq_topic]),
        lambda _topic: out.saturated())))
    changes = op.filter_map("parse", raw, lambda m: parse_change(m, settings.receipts_topic))
    fresh = op.filter("fresh", changes, Fresh(policy.max_age, clock))
    jobs = op.flat_map_batch("resolve", fresh, Resolver(settings))
    dead = op.stateful("deliver", op.key_on("by-message", jobs, lambda j: j.message_id),
                       lambda resume: WebhookLogic(resume, sender=out, settings=settings,
                                                   policy=policy, cipher=cipher, clock=clock,
                                                   rng=rng, eof_timeout=eof_timeout,
                                                   keyring=keyring))
    guard_and_emit(op.key_rm("unkey", dead), guard=None, encode=DlqEncoder(settings),
                   sink=sink or ConfirmingSink(settings))
    return flow


__all__ = [
    "DlqEncoder", "Fresh", "Pending", "Refused", "Request", "Resolver", "Result", "Sender",
    "StatusChange", "Waiting", "WebhookDispatcher", "WebhookJob", "WebhookLogic",
    "WebhookPolicy", "WebhookState", "breaker_id", "build_webhook_flow", "parse_change",
    "tenant_secrets",
]
