"""A tiny OTLP/HTTP receiver for tests: a loopback HTTP server (own thread) that accepts
``POST /v1/traces`` and ``POST /v1/metrics`` (protobuf, optionally gzip) as an OpenTelemetry
Collector would, and keeps every span and metric name it received, so subprocesses that
export with ``otlp-http`` can be checked from the test."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from notiflow.bench.otlp import OtlpEndpoint

KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER",
         5: "CONSUMER"}


def value_of(v: AnyValue) -> Any:
    """A protobuf ``AnyValue`` as a Python value."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(v.kvlist_value.values)
    return getattr(v, kind) if kind else None


def attributes_of(kvs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received (ids as hex)."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    resource: dict[str, Any] = field(default_factory=dict)


class OtlpReceiver(OtlpEndpoint):
    """``with OtlpReceiver() as rx:`` → export to ``rx.endpoint``; read ``rx.spans`` and
    ``rx.metric_names`` (``service.name`` → metric names)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.metrics: dict[str, set[str]] = {}
        self.metric_points: list[tuple[str, str, dict[str, Any], Any]] = []
        self._lock = threading.Lock()
        super().__init__(self._metrics, self._traces)

    def _traces(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        got = []
        for rs in req.resource_spans:
            resource = attributes_of(rs.resource.attributes)
            service = str(resource.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        service=service, name=s.name, kind=KINDS.get(s.kind, str(s.kind)),
                        trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        attributes=attributes_of(s.attributes),
                        links=tuple((lk.trace_id.hex(), lk.span_id.hex()) for lk in s.links),
                        resource=resource))
        with self._lock:
            self.spans.extend(got)

    def _metrics(self, body: bytes) -> None:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        with self._lock:
            for rm in req.resource_metrics:
                service = str(attributes_of(rm.resource.attributes).get("service.name", ""))
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        self.metrics.setdefault(service, set()).add(m.name)
                        data = getattr(m, m.WhichOneof("data") or "", None)
                        for p in getattr(data, "data_points", ()):
                            value = (p.as_double if p.HasField("as_double") else p.as_int) \
                                if hasattr(p, "as_int") else p.count
                            self.metric_points.append((service, m.name,
                                                       attributes_of(p.attributes), value))

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.snapshot() if s.trace_id == trace_id]
