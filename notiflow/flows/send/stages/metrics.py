"""The send step's instruments (``names.py``), created once per process, and the bounded
attributes they are recorded with."""

from __future__ import annotations

from opentelemetry.trace import Span

from notiflow import names, telemetry
from notiflow.adapters.providers.base import Outcome, SendResult
from notiflow.flows.common.items import Work


def attempt_outcome(result: SendResult) -> str:
    """``outcome`` of ``notiflow.send.attempts``: the provider outcome, or ``rate_limited``."""
    return "rate_limited" if result.reason == "rate_limited" else result.outcome.value


def error_type(result: SendResult) -> str | None:
    """``error.type`` of a failed provider call (``timeout``, ``connection``, ``429``,
    ``4xx``, ``5xx``); None when it was accepted or the failure was ours."""
    reason = result.reason or ""
    if result.outcome is Outcome.ACCEPTED or reason.startswith("internal_error"):
        return None
    if reason in ("timeout", "connect_timeout"):
        return "timeout"
    if reason in ("connect_error", "connection_lost", "transport_error", "client_error"):
        return "connection"
    if reason == "rate_limited":
        return "429"
    return "4xx" if result.outcome is Outcome.PERMANENT else "5xx"


class SendMetrics:
    """Counters and histograms of the send step (the gauges live with the dispatcher)."""

    def __init__(self) -> None:
        m = telemetry.meter()
        self.attempts = names.SEND_ATTEMPTS.create(m)
        self.request_duration = names.PROVIDER_REQUEST_DURATION.create(m)
        self.errors = names.PROVIDER_ERRORS.create(m)
        self.accept_to_provider = names.ACCEPT_TO_PROVIDER.create(m)
        self.retries = names.RETRIES_SCHEDULED.create(m)
        self.breaker_transitions = names.BREAKER_TRANSITIONS.create(m)

    def provider_call(self, span: Span, w: Work, result: SendResult, elapsed_s: float) -> None:
        """Count one provider call and describe it on its span."""
        outcome = attempt_outcome(result)
        channel = w.record.channel.value
        self.attempts.add(1, {"tier": w.record.tier.value, "channel": channel,
                              "provider": result.provider_id, "outcome": outcome})
        self.request_duration.record(elapsed_s, {"provider": result.provider_id,
                                                 "channel": channel, "outcome": outcome})
        kind = error_type(result)
        if kind is not None:
            self.errors.add(1, {"provider": result.provider_id, "channel": channel,
                                "error.type": kind})
        if span.is_recording():
            span.set_attribute(names.ATTR_OUTCOME, outcome)
            code = result.error_code or ""
            if code.startswith("http_") and code[5:].isdigit():
                span.set_attribute("http.response.status_code", int(code[5:]))
            if kind is not None:
                span.set_attribute("error.type", kind)


metrics = SendMetrics()
