"""OpenTelemetry export of traces and metrics."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from notiflow.settings.section import _Frozen


class TelemetrySettings(_Frozen):
    """OpenTelemetry export of traces and metrics (``notiflow.telemetry``); off by default."""

    exporter: Literal["off", "console", "otlp-grpc", "otlp-http"] = "off"
    """``off``: no SDK (trace context is still passed on); ``console``: spans and
    metrics as JSON on stdout; ``otlp-grpc`` / ``otlp-http``: to an OTLP receiver."""
    endpoint: str | None = None
    """OTLP endpoint (gRPC ``http://127.0.0.1:4317``, HTTP ``http://127.0.0.1:4318``);
    None = the SDK's default or ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    service_name: str | None = None
    """Overrides ``service.name``; None = ``notiflow-<process>`` (``notiflow-api``,
    ``notiflow-send-p0``, ``notiflow-reconcile``, ``notiflow-webhooks``)."""
    resource_attributes: dict[str, str] = Field(default_factory=dict)
    """Extra resource attributes (e.g. ``deployment.environment``)."""
    sample_ratio: float = Field(1.0, ge=0, le=1)
    """Share of new traces recorded; a continued trace follows its parent's decision."""
    metric_interval: timedelta = timedelta(seconds=10)
    """How often metrics are exported (not scaled by ``time_scale``; ISO 8601 in the
    environment, e.g. ``PT1S``)."""
