"""Every metric and span name notiflow emits, declared once.

Dashboards (``ops/grafana/``) and alert rules (``ops/prometheus/alerts.yml``) depend on these
strings: change a name, unit or kind only together with them (``tests/unit/test_alert_rules.py``
fails when a rule or panel names a series that is not declared here).

Names follow the OpenTelemetry conventions: lower-case dotted namespaces (``notiflow.<area>``),
``snake_case`` inside a component, the unit in the instrument's *unit* field (UCUM: ``s``,
``1``; ``{record}``-style annotations for counts), never in the name, and no ``_total``.

In Prometheus they appear as the OpenTelemetry Collector's ``prometheus`` exporter writes them
(``UnderscoreEscapingWithSuffixes``, the default): dots become underscores, a standard unit adds
its suffix (``s`` → ``_seconds``; ``{…}`` units add nothing), a gauge with unit ``1`` ends in
``_ratio``, a counter in ``_total``; a histogram is scraped as ``_bucket``, ``_sum`` and
``_count`` series. :attr:`Metric.prometheus` computes that name; docs/observability.md lists
all of them. Attribute keys become label names the same way (``error.type`` → ``error_type``).

Metric attributes are short, un-namespaced keys (they become Prometheus labels); span
attributes use the ``notiflow.*`` namespace and the OpenTelemetry semantic conventions
(``messaging.*``, ``http.*``, ``error.type``). Neither ever carries a recipient, a message body,
subject or template variables, or a secret.

Usage::

    from opentelemetry import metrics
    from notiflow import names

    latency = names.ACCEPT_TO_PROVIDER.create(metrics.get_meter(names.METER))
    latency.record(0.42, {"tier": "P0", "channel": "SMS", "provider": "twilio"})
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any

METER = "notiflow"
"""The OpenTelemetry meter and tracer name (instrumentation scope)."""


class Kind(StrEnum):
    """The OpenTelemetry instrument behind a metric."""

    COUNTER = "Counter"
    UP_DOWN_COUNTER = "UpDownCounter"
    GAUGE = "Gauge"
    HISTOGRAM = "Histogram"


_NAME = re.compile(r"notiflow(\.[a-z][a-z0-9_]*)+")
_PROM_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes",
    "MiBy": "mebibytes", "GiBy": "gibibytes", "1": "", "%": "percent",
}
_PROM_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week"}


def prometheus_name(name: str, kind: Kind, unit: str) -> str:
    """The metric name the Collector's ``prometheus`` exporter writes for an OTel metric
    (``UnderscoreEscapingWithSuffixes``; histograms add ``_bucket``/``_sum``/``_count``)."""
    tokens = [t for t in re.split(r"[^a-zA-Z0-9:]+", name) if t]
    main, _, per = unit.partition("/")
    main = main.strip()
    suffix = ""
    if main and "{" not in main and "}" not in main:
        suffix = re.sub(r"[^a-zA-Z0-9:]+", "_", _PROM_UNITS.get(main, main)).strip("_")
    per_suffix = ""
    if per.strip() and "{" not in per and "}" not in per:
        per_suffix = "per_" + _PROM_PER_UNITS.get(per.strip(), per.strip())
    if suffix and suffix not in tokens:
        tokens.append(suffix)
    if per_suffix and per_suffix not in tokens:
        tokens.append(per_suffix)
    if kind is Kind.COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind is Kind.GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    out = "_".join(tokens)
    return f"_{out}" if out[:1].isdigit() else out


def prometheus_label(attribute: str) -> str:
    """The Prometheus label name of a metric attribute (``error.type`` → ``error_type``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


class Metric(str):
    """A metric name (the string itself, usable wherever a name is expected) with its kind,
    unit, attributes and description, so every process creates it the same way."""

    kind: Kind
    unit: str
    attributes: tuple[str, ...]
    description: str
    buckets: tuple[float, ...] | None

    def __new__(cls, name: str, kind: Kind, unit: str, attributes: Sequence[str],
                description: str, buckets: Sequence[float] | None = None) -> Metric:
        if not _NAME.fullmatch(name):
            raise ValueError(f"metric name {name!r} is not notiflow.<dotted.snake_case>")
        if (buckets is not None) != (kind is Kind.HISTOGRAM):
            raise ValueError(f"{name}: bucket boundaries belong to histograms only")
        self = super().__new__(cls, name)
        self.kind = kind
        self.unit = unit
        self.attributes = tuple(attributes)
        self.description = description
        self.buckets = tuple(buckets) if buckets is not None else None
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Metric, (str(self), self.kind, self.unit, self.attributes, self.description,
                         self.buckets))

    @property
    def name(self) -> str:
        return str(self)

    @property
    def prometheus(self) -> str:
        """The Prometheus metric name (for histograms: the family; see :attr:`series`)."""
        return prometheus_name(self, self.kind, self.unit)

    @property
    def series(self) -> tuple[str, ...]:
        """Every Prometheus series name this metric is scraped as."""
        base = self.prometheus
        if self.kind is Kind.HISTOGRAM:
            return (f"{base}_bucket", f"{base}_sum", f"{base}_count")
        return (base,)

    @property
    def labels(self) -> tuple[str, ...]:
        """The Prometheus label names of its attributes."""
        return tuple(prometheus_label(a) for a in self.attributes)

    def create(self, meter: Any, callbacks: Iterable[Callable[..., Any]] | None = None) -> Any:
        """Create the instrument on ``meter`` (an ``opentelemetry.metrics.Meter``). A gauge
        given ``callbacks`` becomes an observable gauge."""
        common = {"unit": self.unit, "description": self.description}
        if self.kind is Kind.COUNTER:
            return meter.create_counter(self.name, **common)
        if self.kind is Kind.UP_DOWN_COUNTER:
            return meter.create_up_down_counter(self.name, **common)
        if self.kind is Kind.HISTOGRAM:
            return meter.create_histogram(self.name, **common,
                                          explicit_bucket_boundaries_advisory=self.buckets)
        if callbacks is not None:
            return meter.create_observable_gauge(self.name, callbacks=list(callbacks), **common)
        return meter.create_gauge(self.name, **common)


class SpanKind(StrEnum):
    """``opentelemetry.trace.SpanKind`` member names (the API stays an optional import)."""

    SERVER = "SERVER"
    CLIENT = "CLIENT"
    PRODUCER = "PRODUCER"
    CONSUMER = "CONSUMER"
    INTERNAL = "INTERNAL"


class Span(str):
    """A span name (the string itself) with its span kind and the attributes it carries."""

    kind: SpanKind
    attributes: tuple[str, ...]

    def __new__(cls, name: str, kind: SpanKind, attributes: Sequence[str]) -> Span:
        if not _NAME.fullmatch(name):
            raise ValueError(f"span name {name!r} is not notiflow.<dotted.snake_case>")
        self = super().__new__(cls, name)
        self.kind = kind
        self.attributes = tuple(attributes)
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (Span, (str(self), self.kind, self.attributes))

    @property
    def name(self) -> str:
        return str(self)


# Histogram bucket boundaries (seconds). Each tier's SLA (1 s, 10 s, 5 min, 1 h) and the
# default TTLs (60 s, 30 min, 4 h, 24 h) are exact boundaries, so "share within SLA" is exact.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 86400.0)
PROVIDER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
STAGE_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                 0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
"""Fine below P0's 1 s SLA, so a stage's p99 is read within a few milliseconds."""


class Stage(StrEnum):
    """The stages of a message's way from acceptance to the provider: the latency budget
    (``notiflow.stage.duration``; docs/architecture.md, "Latency budget"). The SLA path is
    ``api.accept`` → ``kafka`` → ``flow`` → ``dispatch.queue`` → ``dispatch.prepare`` →
    ``dispatch.route`` → ``dispatch.slot`` → ``provider``; the ``api.*`` members inside
    ``api.accept`` split it further, ``api.kafka_ack`` and ``api.settle`` lie on the 202's
    path only (the send flow may already be sending)."""

    API_ADMISSION = "api.admission"
    """Admission control (backlog, tenant and P0 buckets in Redis)."""
    API_TEMPLATE = "api.template"
    """The template version and its variables (cached after the first read)."""
    API_RESERVE = "api.reserve"
    """The idempotency key's reservation (a lightweight transaction in Cassandra)."""
    API_WRITE = "api.write"
    """The message row and the outbox row (Cassandra)."""
    API_ACCEPT = "api.accept"
    """``accepted_at`` → the ingest record handed to the Kafka producer."""
    API_KAFKA_ACK = "api.kafka_ack"
    """Producer call → Kafka acknowledged the record (acks=all)."""
    API_SETTLE = "api.settle"
    """Acknowledged → the key marked ACCEPTED and its outbox row removed."""
    KAFKA = "kafka"
    """Producer call (the record's timestamp) → parsed by the send flow."""
    FLOW = "flow"
    """Parsed → handed to the dispatcher (preferences join, policy, hold, keying)."""
    DISPATCH_QUEUE = "dispatch.queue"
    """Handed over → the dispatcher's event loop starts on the batch."""
    DISPATCH_PREPARE = "dispatch.prepare"
    """Dedup lease, caps, content claim, consent, rendering (per batch)."""
    DISPATCH_ROUTE = "dispatch.route"
    """Breakers consulted and a capacity token taken."""
    DISPATCH_SLOT = "dispatch.slot"
    """Waiting for one of the channel's in-flight slots, and the lease confirmed."""
    PROVIDER = "provider"
    """The provider call, request start → answer."""
    SINK = "sink"
    """The send flow's Kafka sink confirming a batch of its outputs (the worker waits, so
    records arriving meanwhile wait in ``kafka``); per batch, not per message."""

C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM

# --- queue and tier -----------------------------------------------------------------------

INGEST_MESSAGES = Metric(
    "notiflow.ingest.messages", C, "{message}", ("tenant", "channel", "tier", "source"),
    "send requests durably accepted into an ingest topic")
"""Counter {message}: requests durably accepted (source: api, kafka); attributes tenant,
channel, tier, source."""
INGEST_CLAIMS_REFUSED = Metric(
    "notiflow.ingest.claims_refused", C, "{record}", ("flow", "reason"),
    "ingest records dead-lettered because they are not bound to the tenant they name")
"""Counter {record}: records read from an ingest topic (or ``notify.delayed``) whose
``nf-binding`` does not bind them to the tenant they claim (``notiflow/ingest_binding.py``),
dead-lettered as ``tenant_claim_refused`` (reason: unsigned, malformed, unknown_key,
other_tenant, mismatch); attributes flow, reason."""
INGEST_REJECTIONS = Metric(
    "notiflow.ingest.rejections", C, "{request}", ("tenant", "channel", "tier", "reason"),
    "send requests refused at admission")
"""Counter {request}: requests refused at admission (reason: invalid, conflict, shed,
unavailable, forbidden); attributes tenant, channel, tier, reason."""
API_KAFKA_DEFERRED = Metric(
    "notiflow.api.kafka_deferred", G, "{message}", ("lane",),
    "acceptances answered 202 while Kafka did not acknowledge, not yet published")
"""Gauge {message}: records in an API process's Kafka-outage window: accepted and durable in
Cassandra but not yet in Kafka; attributes lane."""
QUEUE_OLDEST_AGE = Metric(
    "notiflow.queue.oldest_age", G, "s", ("tier", "channel"),
    "now minus accepted_at of the oldest non-terminal message")
"""Gauge s: now - accepted_at of the tier's oldest non-terminal message, 0 when none (the SLO
signal); attributes tier, channel."""
RETRY_OLDEST_AGE = Metric(
    "notiflow.retry.oldest_age", G, "s", ("tier", "channel"),
    "now minus accepted_at of the oldest message waiting in RETRY_PENDING")
"""Gauge s: now - accepted_at of the oldest message waiting in RETRY_PENDING, 0 when none;
attributes tier, channel."""
SCHEDULER_LATENESS = Metric(
    "notiflow.scheduler.lateness", H, "s", ("tier", "timer"),
    "how long after its due time a retry or scheduled send fired", LATENESS_BUCKETS)
"""Histogram s: fired - due time of a timer (timer: retry, scheduled: the send flow's hold
step; bucket: a scheduler released a ``scheduled_work`` row); attributes tier, timer."""
STAGE_DURATION = Metric(
    "notiflow.stage.duration", H, "s", ("tier", "stage"),
    "time a message spent in one stage of its way to the provider", STAGE_BUCKETS)
"""Histogram s: one :class:`Stage` of one message (attempt); attributes tier, stage."""
CONSUMER_LAG = Metric(
    "notiflow.consumer.lag", G, "{record}", ("flow", "topic", "partition"),
    "records between a flow's recovered offset and the partition's high watermark")
"""Gauge {record}: high watermark - the flow's next offset per partition (Bytewax keeps
offsets in its recovery store, not a consumer group); attributes flow, topic, partition."""

# --- delivery ---------------------------------------------------------------------------

ACCEPT_TO_PROVIDER = Metric(
    "notiflow.send.accept_to_provider.duration", H, "s", ("tier", "channel", "provider"),
    "durable acceptance (accepted_at) to the provider accepting the message",
    LATENCY_BUCKETS)
"""Histogram s: accepted_at → provider accepted, once per message (the tier SLA); attributes
tier, channel, provider."""
SEND_ATTEMPTS = Metric(
    "notiflow.send.attempts", C, "{attempt}", ("tier", "channel", "provider", "outcome"),
    "provider send attempts by outcome")
"""Counter {attempt}: provider send attempts (outcome: accepted, permanent, transient,
ambiguous, rate_limited); attributes tier, channel, provider, outcome."""
RETRIES_SCHEDULED = Metric(
    "notiflow.send.retries_scheduled", C, "{retry}", ("tier", "channel"),
    "RETRY_PENDING decisions")
"""Counter {retry}: RETRY_PENDING decisions; attributes tier, channel."""
SUPPRESSIONS = Metric(
    "notiflow.send.suppressions", C, "{message}", ("tier", "channel", "reason"),
    "messages SUPPRESSED instead of sent")
"""Counter {message}: messages SUPPRESSED (reason: opt_out, quiet_hours, recipient_cap,
ambiguous, duplicate); attributes tier, channel, reason."""
EXPIRATIONS = Metric(
    "notiflow.send.expirations", C, "{message}", ("tier", "channel"),
    "messages EXPIRED before the provider accepted them")
"""Counter {message}: messages EXPIRED (expires_at passed before acceptance); attributes
tier, channel."""
STATUS_TRANSITIONS = Metric(
    "notiflow.status.transitions", C, "{transition}", ("tier", "channel", "status"),
    "status transitions applied by the reconciler")
"""Counter {transition}: status transitions written by the reconciler (status: the new one,
e.g. DELIVERED, FAILED); attributes tier, channel, status."""
RECEIPTS = Metric(
    "notiflow.receipts", C, "{receipt}", ("provider", "channel", "status"),
    "provider delivery receipts received and normalised")
"""Counter {receipt}: provider receipts normalised by the webhook receiver (status: DELIVERED,
FAILED, BOUNCED, …; delivery rate = DELIVERED / accepted); attributes provider, channel,
status."""
RECEIPTS_FORGED = Metric(
    "notiflow.receipts.forged", C, "{receipt}", ("provider", "reason"),
    "receipts dropped because they do not match the attempt they name")
"""Counter {receipt}: receipts the reconciler dropped because the attempt they name was sent
through another provider or under another provider message id (reason: provider,
provider_message_id, message_id, attempt); attributes provider, reason."""

SMS_KEYWORDS = Metric(
    "notiflow.sms.keywords", C, "{message}", ("provider", "keyword"),
    "inbound texts taken from a provider, by the keyword they are")
"""Counter {message}: texts people sent to the platform's numbers (keyword: STOP, START,
HELP, or none for any other text); attributes provider, keyword."""

# --- providers, limits and breakers ----------------------------------------------------------

PROVIDER_REQUEST_DURATION = Metric(
    "notiflow.provider.request.duration", H, "s", ("provider", "channel", "outcome"),
    "one provider API call, request start to answer", PROVIDER_BUCKETS)
"""Histogram s: one provider call, request start → answer or timeout; attributes provider,
channel, outcome."""
PROVIDER_ERRORS = Metric(
    "notiflow.provider.errors", C, "{request}", ("provider", "channel", "error.type"),
    "failed provider calls by error type")
"""Counter {request}: failed provider calls (error.type: timeout, 5xx, 429, 4xx, connection);
attributes provider, channel, error.type."""
BREAKER_STATE = Metric(
    "notiflow.breaker.state", G, "{state}", ("provider", "lane"),
    "circuit breaker state per provider account and lane: 0 closed, 1 half-open, 2 open")
"""Gauge {state}: breaker of a provider account as a lane's flows see it, 0 CLOSED,
1 HALF_OPEN, 2 OPEN (lane: priority, bulk; a bulk flow reads OPEN while the priority lane's
breaker is); attributes provider, lane."""
BREAKER_TRANSITIONS = Metric(
    "notiflow.breaker.transitions", C, "{transition}",
    ("provider", "lane", "from", "to", "why"), "circuit breaker state changes")
"""Counter {transition}: breaker state changes, once per cluster (why: the reason's word before
':', e.g. failures, open_elapsed); attributes provider, lane, from, to, why."""
PROVIDER_ROUTE_WEIGHT = Metric(
    "notiflow.provider.route_weight", G, "1", ("provider",),
    "routing weight of a provider account (lowered by throttling)")
"""Gauge 1: routing weight of a provider account in [min_weight, 1]; attributes provider."""
RATELIMIT_FILL = Metric(
    "notiflow.ratelimit.fill", G, "1", ("provider", "tier"),
    "capacity a tier may still take in the window at a provider account / its rate")
"""Gauge 1: the room the capacity script reports after a grant (tokens the tier may still take
in the window, reservation plus borrowing) / the account's rate (0 exhausted, 1 idle);
attributes provider, tier."""
RATELIMIT_DENIALS = Metric(
    "notiflow.ratelimit.denials", C, "{request}", ("provider", "tier", "scope"),
    "capacity requests refused by the limiter")
"""Counter {request}: capacity requests refused (scope: provider, tenant, recipient,
emergency); attributes provider, tier, scope."""

BULK_WINDOW = Metric(
    "notiflow.bulk.window", G, "1", ("tier",),
    "a bulk send flow's in-flight window over its ceiling (1 = not yielding to P0)")
"""Gauge 1: limit / ceiling of a bulk-lane flow's in-flight window per channel, set by P0's
latency signal (``flows/common/yielding.py``); attributes tier."""
P0_WORST_LATENCY = Metric(
    "notiflow.p0.worst_latency", G, "s", ("tier",),
    "worst P0 latency this process saw in the last second (the signal bulk work yields by)")
"""Gauge s: the worst P0 acceptance → provider latency completed in the last second, or the
age of the oldest P0 message held, as this process reports it (``adapters/pressure.py``);
attributes tier."""

GC_PAUSE = Metric(
    "notiflow.runtime.gc_pause", H, "s", ("generation",),
    "a collection of Python's cyclic garbage collector (the process stops meanwhile)",
    STAGE_BUCKETS)
"""Histogram s: one collection of generation 1 or 2, or of generation 0 when it took over
5 ms (younger ones are too many and too short to record); attributes generation."""

# --- in-app inbox (notiflow inbox) -------------------------------------------------------------

INBOX_CONNECTIONS = Metric(
    "notiflow.inbox.connections", G, "{connection}", ("transport",),
    "live inbox connections of this notiflow inbox process")
"""Gauge {connection}: WebSocket and event-stream connections open in this process (transport
ws or sse); attributes transport."""
INBOX_FRAMES = Metric(
    "notiflow.inbox.frames", C, "{frame}", ("process",),
    "inbox events handed to live connections")
"""Counter {frame}: events from Redis queued for a live connection (process: inbox);
attributes process."""
INBOX_OVERFLOWS = Metric(
    "notiflow.inbox.overflows", C, "{connection}", ("process",),
    "inbox connections closed for falling send_queue frames behind")
"""Counter {connection}: connections closed because the client fell ``send_queue`` frames
behind, to catch up on reconnect (process: inbox); attributes process."""
INBOX_REFUSALS = Metric(
    "notiflow.inbox.refusals", C, "{connection}", ("reason",),
    "inbox connections refused before the upgrade")
"""Counter {connection}: WebSocket and event-stream connections refused before the upgrade
(``inbox/limits.py``): reason server_full (503), tenant_connections or connect_rate (429);
attributes reason."""

# --- dead letters and client webhooks ---------------------------------------------------------

DLQ_DEPTH = Metric(
    "notiflow.dlq.depth", G, "{record}", ("dlq",),
    "unresolved dead letters per DLQ")
"""Gauge {record}: unresolved dead letters per DLQ (dlq: P0…P3, reconcile, webhooks);
attributes dlq."""
DLQ_RECORDS = Metric(
    "notiflow.dlq.records", C, "{record}", ("dlq", "category", "error_class"),
    "dead letters written")
"""Counter {record}: dead letters written; attributes dlq, category, error_class."""
DLQ_LIMIT_BREACHES = Metric(
    "notiflow.dlq.limit_breaches", C, "{breach}", ("flow",),
    "consumers halted by their DLQ limit")
"""Counter {breach}: a consumer halted by its DLQ limit (add 0 per flow at start, so the first
breach is a visible step); attributes flow."""
DLQ_QUARANTINES = Metric(
    "notiflow.dlq.quarantines", C, "{quarantine}", ("flow", "source"),
    "sources quarantined for a burst of invalid records")
"""Counter {quarantine}: a source (``tenant:<id>``, ``producer:<name>``, ``unattributed``)
whose invalid records reached ``dlq.quarantine_after`` within a flow's window; attributes
flow, source."""
CLIENT_WEBHOOK_DELIVERIES = Metric(
    "notiflow.webhooks.deliveries", C, "{request}", ("outcome",),
    "client status webhook POSTs")
"""Counter {request}: client status webhook POSTs (outcome: delivered, failed, dead);
attributes outcome."""
SECRETS_RELOADS = Metric(
    "notiflow.secrets.reloads", C, "{reload}", ("outcome",),
    "changes of the secrets directory a process read")
"""Counter {reload}: a change of ``NOTIFLOW_SECRETS_DIR`` seen by a process (outcome:
applied, unchanged (nothing reloadable differed), invalid (did not load; the credentials in
force stay)); attributes outcome."""
CAMPAIGN_ROWS = Metric(
    "notiflow.campaign.rows", C, "{row}", ("campaign", "tenant", "outcome"),
    "manifest rows a campaign expander handled")
"""Counter {row}: rows of a campaign's manifest, one series per campaign and outcome (outcome:
expanded, held for a local window, rejected); attributes campaign, tenant, outcome."""

del C, G, H

# --- span attributes (keys) ---------------------------------------------------------------

ATTR_MESSAGE_ID = "notiflow.message.id"
ATTR_TENANT_ID = "notiflow.tenant.id"
ATTR_TIER = "notiflow.tier"
ATTR_CHANNEL = "notiflow.channel"
ATTR_PROVIDER = "notiflow.provider"
ATTR_ATTEMPT = "notiflow.attempt"
ATTR_OUTCOME = "notiflow.outcome"
ATTR_STATUS = "notiflow.status"
ATTR_BATCH_SIZE = "notiflow.batch.size"
"""Items of a ``POST /v1/messages:batch`` call."""
ATTR_BATCH_ACCEPTED = "notiflow.batch.accepted"
"""Items of a batch call answered 202."""
ATTR_KAFKA_DEFERRED = "notiflow.kafka.deferred"
"""The record was answered 202 from Cassandra's durability while Kafka did not acknowledge."""

_MSG = (ATTR_MESSAGE_ID, ATTR_TENANT_ID, ATTR_TIER, ATTR_CHANNEL)

# --- spans: one trace per message, API → ingest → send → provider → receipt → reconcile → webhook

API_REQUEST = Span("notiflow.api.request", SpanKind.INTERNAL, (*_MSG, "notiflow.idempotent_replay"))
"""Span INTERNAL: one Messaging API acceptance inside the FastAPI server span (``POST
/v1/messages``); attributes message.id, tenant.id, tier, channel, idempotent_replay."""
API_BATCH = Span("notiflow.api.batch", SpanKind.INTERNAL,
                 (ATTR_TENANT_ID, ATTR_BATCH_SIZE, ATTR_BATCH_ACCEPTED))
"""Span INTERNAL: one ``POST /v1/messages:batch`` call, each item's acceptance a
``notiflow.api.request`` span inside it; attributes tenant.id, batch.size, batch.accepted."""
INGEST_PRODUCE = Span("notiflow.ingest.produce", SpanKind.PRODUCER,
                      (*_MSG, "messaging.system", "messaging.destination.name",
                       ATTR_KAFKA_DEFERRED))
"""Span PRODUCER: writing the ingest record (its context goes into the ``traceparent``
header; kafka.deferred: answered from the Kafka-outage window); attributes message.id,
tenant.id, tier, channel, messaging.system, messaging.destination.name, kafka.deferred."""
SEND = Span("notiflow.send", SpanKind.CONSUMER, (*_MSG, ATTR_ATTEMPT, ATTR_PROVIDER, ATTR_OUTCOME))
"""Span CONSUMER: one send attempt in a tier flow, parent from the record's ``traceparent``;
attributes message.id, tenant.id, tier, channel, attempt, provider, outcome."""
PROVIDER_CALL = Span("notiflow.provider.call", SpanKind.CLIENT,
                     (ATTR_MESSAGE_ID, ATTR_PROVIDER, ATTR_CHANNEL, ATTR_ATTEMPT, ATTR_OUTCOME,
                      "http.response.status_code", "error.type"))
"""Span CLIENT: one provider API call (explicit, around the adapter's send); attributes message.id,
provider, channel, attempt, outcome, http.response.status_code, error.type."""
RECEIPT = Span("notiflow.receipt", SpanKind.INTERNAL,
               (ATTR_MESSAGE_ID, ATTR_PROVIDER, ATTR_STATUS, "notiflow.receipt.duplicate"))
"""Span INTERNAL: a provider receipt normalised by the webhook receiver, joined to the
message's trace; attributes message.id, provider, status, receipt.duplicate."""
RECONCILE = Span("notiflow.reconcile", SpanKind.CONSUMER,
                 (ATTR_MESSAGE_ID, ATTR_TIER, ATTR_STATUS, "notiflow.status.previous",
                  "notiflow.reconcile.applied"))
"""Span CONSUMER: applying one status event or receipt to Cassandra; attributes message.id,
tier, status, status.previous, reconcile.applied."""
CLIENT_WEBHOOK = Span("notiflow.client_webhook", SpanKind.CLIENT,
                      (ATTR_MESSAGE_ID, ATTR_TENANT_ID, ATTR_STATUS, ATTR_ATTEMPT,
                       ATTR_OUTCOME, "http.response.status_code"))
"""Span CLIENT: one POST of a status change to the tenant's status_webhook; attributes
message.id, tenant.id, status, attempt, outcome, http.response.status_code."""

del _MSG

METRICS: dict[str, Metric] = {v: v for v in list(globals().values()) if isinstance(v, Metric)}
"""Every declared metric, by OpenTelemetry name."""
SPANS: dict[str, Span] = {v: v for v in list(globals().values()) if isinstance(v, Span)}
"""Every declared span, by name."""


def prometheus_series() -> dict[str, Metric]:
    """Every Prometheus series name the declared metrics are scraped as → its metric."""
    return {s: m for m in METRICS.values() for s in m.series}
