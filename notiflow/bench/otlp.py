"""The latency budget as the benchmarks read it: an OTLP/HTTP metrics receiver (a thread of the
bench process) that keeps every data point of ``notiflow.stage.duration``.

The phase's processes export with ``otlp-http`` to :attr:`StageCollector.endpoint`, delta
temporality, every two seconds, and sample no traces (:func:`exporter_env`). Each point is one
process's histogram of one (tier, stage) over one export interval, so the points give both
the whole run's distribution per stage and, second by second, where a stall happened.
"""

from __future__ import annotations

import bisect
import gzip
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from notiflow import names
from notiflow.devenv import free_port

GAUGES = frozenset({names.BULK_WINDOW, names.P0_WORST_LATENCY})
"""Gauges kept as time series: how far bulk work yielded, and the signal it yielded by."""


def yielded(window: list[tuple[float, float]], t0: float, t1: float) -> dict[str, float]:
    """How bulk work yielded between ``t0`` and ``t1``: the share of samples below full
    window, the smallest window, the mean."""
    got = [v for t, v in window if t0 <= t <= t1]
    if not got:
        return {"samples": 0}
    return {"samples": len(got), "share_yielding": round(sum(v < 1 for v in got) / len(got), 3),
            "min": round(min(got), 3), "mean": round(sum(got) / len(got), 3)}


COLLECTOR_NICE = 10
EXPORT_INTERVAL_S = 2
EXPORT_INTERVAL = f"PT{EXPORT_INTERVAL_S}S"


def exporter_env(endpoint: str) -> dict[str, str]:
    """Settings that make a process export its metrics to ``endpoint`` every two seconds
    (delta histograms) while recording no spans."""
    return {"NOTIFLOW_TELEMETRY__EXPORTER": "otlp-http",
            "NOTIFLOW_TELEMETRY__ENDPOINT": endpoint,
            "NOTIFLOW_TELEMETRY__SAMPLE_RATIO": "0",
            "NOTIFLOW_TELEMETRY__METRIC_INTERVAL": EXPORT_INTERVAL,
            "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "DELTA"}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@dataclass(frozen=True, slots=True)
class StagePoint:
    """One exported histogram point: one process, one (tier, stage), one interval."""

    service: str
    tier: str
    stage: str
    end: float
    """End of the interval, epoch seconds."""
    count: int
    total: float
    max: float
    bounds: tuple[float, ...]
    counts: tuple[int, ...]


def otlp_server(port: int, on_metrics: Callable[[bytes], None],
                on_traces: Callable[[bytes], None] | None = None) -> ThreadingHTTPServer:
    """An OTLP/HTTP (protobuf) receiver on loopback ``port``: each export's body, gunzipped,
    goes to ``on_metrics`` or ``on_traces`` (traces only acknowledged when None); other
    paths get 404. Serve it from a thread of the caller's."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/metrics":
                on_metrics(body)
                answer = ExportMetricsServiceResponse().SerializeToString()
            elif self.path == "/v1/traces":
                if on_traces is not None:
                    on_traces(body)
                answer = ExportTraceServiceResponse().SerializeToString()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


class OtlpEndpoint:
    """An :func:`otlp_server` on a free loopback port, served from a daemon thread between
    ``__enter__`` and ``__exit__``; exporters send to :attr:`endpoint`."""

    def __init__(self, on_metrics: Callable[[bytes], None],
                 on_traces: Callable[[bytes], None] | None = None,
                 thread_name: str | None = None) -> None:
        self.port = free_port()
        self._server = otlp_server(self.port, on_metrics=on_metrics, on_traces=on_traces)
        self._thread = threading.Thread(target=self._serve, daemon=True, name=thread_name)

    def _serve(self) -> None:
        self._server.serve_forever()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class StageCollector(OtlpEndpoint):
    """``with StageCollector() as c:`` → processes export to ``c.endpoint``; ``c.points()``."""

    def __init__(self) -> None:
        self._points: list[StagePoint] = []
        self._gauges: dict[str, list[tuple[float, float]]] = {}
        self._gc: list[tuple[str, float, int, float, float]] = []
        self._lock = threading.Lock()
        super().__init__(self._receive, thread_name="bench-otlp")

    def _serve(self) -> None:
        """The server's thread (and the handler threads it starts, which inherit it) at
        :data:`COLLECTOR_NICE`: parsing every process's exports is the benchmark's work, not
        the platform's, and must not take the cores from it."""
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COLLECTOR_NICE)
        super()._serve()

    def points(self) -> list[StagePoint]:
        with self._lock:
            return list(self._points)

    def gc_pauses(self, t0: float, t1: float) -> dict[str, dict[str, Any]]:
        """Per process (``service.name``): Python GC collections recorded between ``t0`` and
        ``t1``, their total and longest time (ms), and when one took over 50 ms."""
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            rows = [r for r in self._gc if t0 <= r[1] <= t1 + 3]
        for service, end, count, total, top in sorted(rows, key=lambda r: r[1]):
            o = out.setdefault(service, {"collections": 0, "total_ms": 0.0, "max_ms": 0.0,
                                         "long": []})
            o["collections"] += count
            o["total_ms"] = round(o["total_ms"] + total * 1000, 1)
            o["max_ms"] = round(max(o["max_ms"], top * 1000), 1)
            if top > 0.05:
                o["long"].append((round(end - t0, 1), round(top * 1000, 1)))
        return out

    def gauge(self, name: str) -> list[tuple[float, float]]:
        """(epoch seconds, value) of every exported point of gauge ``name`` (one of
        :data:`GAUGES`), in time order."""
        with self._lock:
            return sorted(self._gauges.get(name, []))

    def _receive(self, body: bytes) -> None:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        got: list[StagePoint] = []
        gauges: dict[str, list[tuple[float, float]]] = {}
        collections: list[tuple[str, float, int, float, float]] = []
        for rm in req.resource_metrics:
            service = next((str(_value(kv.value)) for kv in rm.resource.attributes
                            if kv.key == "service.name"), "")
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name in GAUGES and m.WhichOneof("data") == "gauge":
                        gauges.setdefault(m.name, []).extend(
                            (p.time_unix_nano / 1e9, p.as_double) for p in m.gauge.data_points)
                        continue
                    if m.name == names.GC_PAUSE and m.WhichOneof("data") == "histogram":
                        collections.extend(
                            (service, p.time_unix_nano / 1e9, int(p.count), p.sum, p.max)
                            for p in m.histogram.data_points if p.count)
                        continue
                    if m.name != names.STAGE_DURATION or m.WhichOneof("data") != "histogram":
                        continue
                    for p in m.histogram.data_points:
                        attrs = {kv.key: _value(kv.value) for kv in p.attributes}
                        if not p.count:
                            continue
                        got.append(StagePoint(
                            service=service, tier=str(attrs.get("tier", "")),
                            stage=str(attrs.get("stage", "")),
                            end=p.time_unix_nano / 1e9, count=int(p.count), total=p.sum,
                            max=p.max, bounds=tuple(p.explicit_bounds),
                            counts=tuple(int(c) for c in p.bucket_counts)))
        with self._lock:
            self._points.extend(got)
            for name, values in gauges.items():
                self._gauges.setdefault(name, []).extend(values)
            self._gc.extend(collections)


def quantile(bounds: tuple[float, ...], counts: list[int], q: float) -> float:
    """The ``q``-quantile of a bucketed distribution, linear within its bucket (the upper
    bound of the last finite bucket for the overflow bucket)."""
    total = sum(counts)
    if total == 0:
        return 0.0
    rank = q * total
    cumulative = [0]
    for c in counts:
        cumulative.append(cumulative[-1] + c)
    i = max(0, bisect.bisect_left(cumulative, rank) - 1)
    i = min(i, len(counts) - 1)
    lo = 0.0 if i == 0 else bounds[i - 1]
    hi = bounds[i] if i < len(bounds) else bounds[-1]
    inside = counts[i] or 1
    return lo + (hi - lo) * min(1.0, max(0.0, (rank - cumulative[i]) / inside))


def budget(points: Iterable[StagePoint], tier: str, t0: float | None = None,
           t1: float | None = None) -> dict[str, dict[str, float]]:
    """Per stage of ``tier`` (points whose interval ended in ``[t0, t1]``): count, mean,
    p50 and p99 in ms (from the buckets), max in ms (exact)."""
    merged: dict[str, tuple[tuple[float, ...], list[int], float, float, int]] = {}
    for p in points:
        if p.tier != tier or (t0 is not None and p.end < t0) or (t1 is not None
                                                                  and p.end > t1 + 3):
            continue
        bounds, counts, total, top, n = merged.get(p.stage, (p.bounds, [0] * len(p.counts),
                                                             0.0, 0.0, 0))
        if len(counts) != len(p.counts):
            continue
        merged[p.stage] = (bounds, [a + b for a, b in zip(counts, p.counts, strict=True)],
                           total + p.total, max(top, p.max), n + p.count)
    order = [s.value for s in names.Stage]
    out: dict[str, dict[str, float]] = {}
    for stage in sorted(merged, key=lambda s: order.index(s) if s in order else len(order)):
        bounds, counts, total, top, n = merged[stage]
        out[stage] = {"count": n, "mean_ms": round(total / n * 1000, 1),
                      "p50_ms": round(quantile(bounds, counts, 0.5) * 1000, 1),
                      "p99_ms": round(quantile(bounds, counts, 0.99) * 1000, 1),
                      "max_ms": round(top * 1000, 1)}
    return out


def stalls(points: Iterable[StagePoint], tier: str, t0: float, above_s: float = 0.25
           ) -> list[tuple[float, str, float]]:
    """(seconds after ``t0``, stage, max ms) of every export interval in which a stage of
    ``tier`` took longer than ``above_s``: where and when the slow messages waited."""
    out = [(round(p.end - t0, 1), p.stage, round(p.max * 1000, 1)) for p in points
           if p.tier == tier and p.max > above_s and p.end >= t0]
    return sorted(out)
