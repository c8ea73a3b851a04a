"""OpenTelemetry and logging for every notiflow process, configured in one place.

Each entry point calls :func:`setup` once (the API in ``gateway/app.py``, every dataflow in
``flows/common/runner.py``); everything else uses the helpers here and the names declared in
``notiflow/names.py``:

- :func:`span` starts a declared span (kind from the declaration), optionally continuing a
  W3C ``traceparent`` (a Kafka header, a provider callback's correlation) and with links;
  inside it, log lines carry the trace, span and message ids.
- :func:`current_traceparent` / :func:`traceparent_of` / :func:`header_traceparent` turn span
  contexts into the ``traceparent`` header value written to every Kafka record and back.
- :func:`meter` gives the meter the instruments are created on (``names.X.create(meter())``).

Exporters (``settings.telemetry.exporter``): ``off`` (the default: no SDK and no
OpenTelemetry work per message; :func:`span` still passes the ``traceparent`` it continues on,
so records keep theirs),
``console`` (JSON lines on stdout), ``otlp-grpc``, ``otlp-http``. Library instrumentation:
FastAPI (server spans whose URL attributes carry the route template, never the path or
query string: those may hold a recipient or a device token) and Redis (commands only,
arguments sanitised) in the API.
The aiohttp client, cassandra-driver and confluent-kafka instrumentations have no release for
``opentelemetry-api`` 1.45.2 (their latest, 0.66b1, pins 1.45.1): provider calls get an
explicit ``notiflow.provider.call`` span (which also keeps device tokens in APNs URLs out of
span attributes), Kafka context travels in our own headers (Bytewax's consumer is not
instrumentable anyway), and Cassandra calls are inside the message's spans.

Logs: ``settings.log_format`` (``NOTIFLOW_LOG_FORMAT``) ``text`` for a terminal or ``json``,
one object per line with ``trace_id``, ``span_id`` and ``message_id`` when known. Both
formatters mask phone numbers and e-mail addresses that slip into a message.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import copy
import gc
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from notiflow import names
from notiflow.redact import mask
from notiflow.settings import Settings

log = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
_W3C = TraceContextTextMapPropagator()
_tracer = trace.get_tracer(names.METER)
_message_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "notiflow_message_id", default=None)
_passed_on: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "notiflow_traceparent", default=None)
"""Export off: the ``traceparent`` a :func:`span` continues, passed on unchanged."""
_lock = threading.Lock()
_state: Telemetry | None = None


# trace context ---------------------------------------------------------------------------


def format_traceparent(ctx: SpanContext) -> str | None:
    """``00-<trace id>-<span id>-<flags>`` of a valid span context, else None."""
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def traceparent_of(span: trace.Span) -> str | None:
    """The ``traceparent`` that makes a receiver's span a child of ``span``."""
    return format_traceparent(span.get_span_context())


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span; with export off, the one the current
    :func:`span` continues (None outside any)."""
    ctx = trace.get_current_span().get_span_context()
    return format_traceparent(ctx) if ctx.is_valid else _passed_on.get()


def header_traceparent(headers: Sequence[tuple[str, bytes | None]] | None) -> str | None:
    """The ``traceparent`` header of a Kafka record, if any."""
    for k, v in headers or ():
        if k == TRACEPARENT and v:
            return v.decode(errors="replace")
    return None


def context_of(traceparent: str | None) -> otel_context.Context | None:
    """An OpenTelemetry context whose remote parent is ``traceparent`` (None if invalid)."""
    if not traceparent:
        return None
    ctx = _W3C.extract({TRACEPARENT: traceparent})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def trace_id_of(traceparent: str | None) -> int | None:
    """The trace id of ``traceparent`` (None if invalid)."""
    ctx = context_of(traceparent)
    return None if ctx is None else trace.get_current_span(ctx).get_span_context().trace_id


def link_to(traceparent: str | None) -> Link | None:
    """A span link to ``traceparent`` (None if invalid)."""
    ctx = context_of(traceparent)
    return None if ctx is None else Link(trace.get_current_span(ctx).get_span_context())


# spans -------------------------------------------------------------------------------------


@contextlib.contextmanager
def span(declared: names.Span, attributes: Mapping[str, Any] | None = None, *,
         parent: str | None = None, links: Sequence[Link | None] = (),
         message_id: str | None = None) -> Iterator[trace.Span]:
    """Start the declared span as the current one; ``parent``: a ``traceparent`` to continue
    (else the current span's trace), ``links``: related traces. ``None`` attribute values are
    left out. Log lines inside carry ``message_id`` (default: the ``notiflow.message.id``
    attribute). Only declared attributes belong here, never a recipient or content."""
    mid = message_id or (attributes or {}).get(names.ATTR_MESSAGE_ID)
    token = _message_id.set(mid) if mid else None
    try:
        if _state is None or _state.tracer_provider is None:
            # export off: no OpenTelemetry work per message, only the context passed on
            passed = _passed_on.set(parent) if parent else None
            try:
                yield trace.INVALID_SPAN
            finally:
                if passed is not None:
                    _passed_on.reset(passed)
            return
        attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
        with _tracer.start_as_current_span(
                str(declared), context=context_of(parent), kind=SpanKind[declared.kind.value],
                attributes=attrs, links=[x for x in links if x is not None]) as sp:
            yield sp
    finally:
        if token is not None:
            _message_id.reset(token)


def started(declared: names.Span, attributes: Mapping[str, Any] | None = None, *,
            parent: str | None = None, links: Sequence[Link | None] = ()) -> trace.Span:
    """The declared span, started but not made current; the caller ends it. For work done
    for many messages at once, whose spans end together (:func:`span` otherwise)."""
    if _state is None or _state.tracer_provider is None:
        return trace.INVALID_SPAN
    attrs = {k: v for k, v in (attributes or {}).items() if v is not None}
    return _tracer.start_span(str(declared), context=context_of(parent),
                              kind=SpanKind[declared.kind.value], attributes=attrs,
                              links=[x for x in links if x is not None])


@contextlib.contextmanager
def message_context(message_id: str | None) -> Iterator[None]:
    """Log lines inside carry ``message_id`` (without starting a span)."""
    token = _message_id.set(message_id) if message_id else None
    try:
        yield
    finally:
        if token is not None:
            _message_id.reset(token)


def meter() -> metrics.Meter:
    """The notiflow meter (instruments: ``names.X.create(meter())``)."""
    return metrics.get_meter(names.METER)


def enabled() -> bool:
    """Whether an exporter is configured in this process (spans are recorded)."""
    return _state is not None and _state.tracer_provider is not None


# logs ----------------------------------------------------------------------------------------

_PHONE = re.compile(r"\+[1-9]\d{6,14}\b")
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}\b")
HIDDEN_PATH = "<path>"
"""What a uvicorn access line shows instead of the request's path."""
_RESERVED = frozenset(vars(logging.makeLogRecord({})).keys()) | {
    "message", "asctime", "trace_id", "span_id", "message_id", "color_message"}


def scrub(text: str) -> str:
    """Mask phone numbers (E.164) and e-mail addresses in free text (a safety net: code never
    logs a recipient on purpose)."""
    if "+" in text:
        text = _PHONE.sub(lambda m: mask(m.group(0)), text)
    if "@" in text:
        text = _EMAIL.sub(lambda m: mask(m.group(0)), text)
    return text


class TraceContextFilter(logging.Filter):
    """Adds ``trace_id``, ``span_id`` (hex; empty outside a span) and ``message_id`` (when
    known: inside :func:`span` / :func:`message_context`, or passed with ``extra=``), and
    replaces the path of a uvicorn access line by :data:`HIDDEN_PATH` (the API writes its own,
    by route template: ``gateway/access_log.py``; a path may carry a recipient)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) >= 3:
            record.args = (*args[:2], HIDDEN_PATH, *args[3:])
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = f"{ctx.trace_id:032x}" if ctx.is_valid else ""
        record.span_id = f"{ctx.span_id:016x}" if ctx.is_valid else ""
        if getattr(record, "message_id", None) is None:
            record.message_id = _message_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC ISO 8601), ``level``, ``logger``, ``message``,
    ``trace_id``/``span_id``/``message_id`` when known, other ``extra=`` fields, and
    ``exception``. Text is passed through :func:`scrub`."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        for key in ("trace_id", "span_id", "message_id"):
            value = getattr(record, key, None)
            if value:
                doc[key] = value
        for key, value in vars(record).items():
            if key not in _RESERVED and key not in doc and not key.startswith("_"):
                doc[key] = value if isinstance(value, int | float | bool) or value is None \
                    else scrub(str(value))
        if record.exc_info:
            doc["exception"] = scrub(self.formatException(record.exc_info))
        elif record.exc_text:
            doc["exception"] = scrub(record.exc_text)
        return orjson.dumps(doc, default=str).decode()


class TextFormatter(logging.Formatter):
    """The human format: ``time LEVEL logger: message``, plus ``[message_id]`` when known;
    text passed through :func:`scrub`."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None) -> None:
        super().__init__(fmt or "%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt)

    def format(self, record: logging.LogRecord) -> str:
        line = scrub(super().format(record))
        mid = getattr(record, "message_id", None)
        return f"{line} [{mid}]" if mid and mid not in line else line


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``settings.log_format`` (``json`` or ``text``)."""
    return JsonFormatter() if fmt == "json" else TextFormatter()


def log_config(base: Mapping[str, Any], fmt: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict (e.g. uvicorn's ``log_config``) whose formatters
    are notiflow's for ``fmt`` and whose handlers add the trace context."""
    cfg = copy.deepcopy(dict(base))
    cls = f"{__name__}.{'JsonFormatter' if fmt == 'json' else 'TextFormatter'}"
    cfg["formatters"] = {name: {"()": cls} for name in cfg.get("formatters") or {"plain": {}}}
    cfg.setdefault("filters", {})["trace_context"] = {"()": f"{__name__}.TraceContextFilter"}
    for handler in cfg.get("handlers", {}).values():
        handler["filters"] = [*handler.get("filters", []), "trace_context"]
    return cfg


def configure_logging(fmt: str, level: int = logging.INFO) -> None:
    """Root logging to stdout in ``fmt`` (``json`` or ``text``), with the trace context."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(TraceContextFilter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)


# providers ---------------------------------------------------------------------------------


class Telemetry:
    """The providers of this process (None when export is off); :meth:`shutdown` flushes."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None,
                 resource: Any = None) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.resource = resource

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporters (idempotent)."""
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                with contextlib.suppress(Exception):
                    provider.shutdown()
        self.tracer_provider = self.meter_provider = None


def resource_attributes(settings: Settings, process: str, *, tier: str | None = None,
                        worker: str | int | None = None) -> dict[str, str]:
    """``service.name`` (``notiflow-<process>`` unless configured), ``service.namespace``,
    ``service.instance.id``, ``notiflow.tier``, ``notiflow.worker`` and the configured
    extras."""
    t = settings.telemetry
    attrs = {
        "service.name": t.service_name or f"notiflow-{process}",
        "service.namespace": "notiflow",
        "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
    }
    if tier:
        attrs["notiflow.tier"] = tier
    if worker is not None:
        attrs["notiflow.worker"] = str(worker)
    attrs.update(t.resource_attributes)
    return attrs


def _exporters(settings: Settings) -> tuple[Any, Any]:
    t = settings.telemetry
    if t.exporter == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return (ConsoleSpanExporter(formatter=lambda s: s.to_json(indent=None) + "\n"),
                ConsoleMetricExporter(formatter=lambda m: m.to_json(indent=None) + "\n"))
    if t.exporter == "otlp-grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = t.endpoint or None
        return OTLPSpanExporter(endpoint=endpoint), OTLPMetricExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpanExporter,
    )

    base = (t.endpoint or "").rstrip("/")
    return (HttpSpanExporter(endpoint=f"{base}/v1/traces" if base else None),
            HttpMetricExporter(endpoint=f"{base}/v1/metrics" if base else None))


def setup(settings: Settings, process: str, *, tier: str | None = None,
          worker: str | int | None = None, logs: bool = True) -> Telemetry:
    """Configure this process once: logging (``settings.log_format``) unless ``logs`` is
    False, and, unless the exporter is ``off``, the global tracer and meter providers with
    the resource of :func:`resource_attributes`. Later calls return the first result."""
    global _state
    if logs:
        configure_logging(settings.log_format)
    with _lock:
        if _state is not None:
            return _state
        t = settings.telemetry
        if t.exporter == "off":
            _state = Telemetry()
            return _state
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        resource = Resource.create(resource_attributes(settings, process, tier=tier,
                                                       worker=worker))
        spans, points = _exporters(settings)
        tracer_provider = TracerProvider(resource=resource,
                                         sampler=ParentBased(TraceIdRatioBased(t.sample_ratio)))
        tracer_provider.add_span_processor(BatchSpanProcessor(spans))
        reader = PeriodicExportingMetricReader(
            points, export_interval_millis=max(100.0, t.metric_interval.total_seconds() * 1000))
        meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        watch_gc()
        _state = Telemetry(tracer_provider, meter_provider, resource)
        atexit.register(_state.shutdown)
        log.info("telemetry: %s export as %s", t.exporter,
                 resource.attributes.get("service.name"))
        return _state


_GC_SLOW_YOUNG_S = 0.005


def watch_gc() -> None:
    """Record the collections of Python's garbage collector as ``notiflow.runtime.gc_pause``
    (generations 1 and 2, and generation 0 when slower than 5 ms): a pause of the process
    shows up as a stage's delay, and this says whether the collector caused it."""
    pauses = names.GC_PAUSE.create(meter())
    started: list[float] = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        took = time.perf_counter() - started[0]
        generation = info.get("generation", 0)
        if generation or took > _GC_SLOW_YOUNG_S:
            pauses.record(took, {"generation": str(generation)})

    gc.callbacks.append(callback)


def _origin(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.split('/', 1)[0].split('?', 1)[0]}" if sep else ""


def route_only(route_of: Callable[[Mapping[str, Any]], str]
               ) -> Callable[[trace.Span, Mapping[str, Any]], None]:
    """A server span hook: the span's name (``<method> <route>``) and every URL attribute
    name the route (``route_of(scope)``, a template such as ``/v1/recipients/{recipient}``),
    never the request's path or query string, which may carry a recipient or a device
    token."""

    def hook(span: trace.Span, scope: Mapping[str, Any]) -> None:
        if not span.is_recording():
            return
        route = route_of(scope)
        attrs = getattr(span, "attributes", None) or {}
        for key in ("http.target", "url.path"):
            if key in attrs:
                span.set_attribute(key, route)
        for key in ("http.url", "url.full"):
            value = attrs.get(key)
            if isinstance(value, str):
                span.set_attribute(key, _origin(value) + route)
        if "url.query" in attrs:
            span.set_attribute("url.query", "")
        if "http.route" in attrs:
            span.set_attribute("http.route", route)
        method = str(getattr(span, "name", "") or "").split(" ", 1)[0] or "HTTP"
        span.update_name(f"{method} {route}")

    return hook


def instrument_api(app: Any, route_of: Callable[[Mapping[str, Any]], str]) -> None:
    """FastAPI server spans (health checks excluded) whose URL attributes carry the route
    template ``route_of(scope)`` (:func:`route_only`), and Redis client spans, for the API
    process; a no-op while export is off."""
    if _state is None or _state.tracer_provider is None:
        return
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    FastAPIInstrumentor.instrument_app(app, excluded_urls="/healthz,/readyz",
                                       server_request_hook=route_only(route_of),
                                       tracer_provider=_state.tracer_provider,
                                       exclude_spans=["receive", "send"])
    instrumentor = RedisInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()
