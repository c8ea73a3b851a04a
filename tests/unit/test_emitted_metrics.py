"""Metrics emitted by the rate limiter, the Hold step, the ingest parser and the
Kafka source, read back with an in-memory OpenTelemetry reader."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from notiflow import names
from notiflow.adapters import bytewax_kafka
from notiflow.adapters.ratelimit import CapacityLimiter
from notiflow.adapters.ratelimit import limiter as ratelimit_limiter
from notiflow.flows.common import steps
from notiflow.flows.common.steps import Hold
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.unit.test_ratelimit_model import limiter_for
from tests.unit.test_steps import NOW, body, kmsg, parse, work
from tests.unit.test_steps import settings as settings


class Metrics:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.meter = self.provider.get_meter(names.METER)

    def points(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        out: list[Any] = []
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == name:
                        out.extend(m.data.data_points)
        return out

    def values(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        return {tuple(sorted(p.attributes.items())): getattr(p, "value", None)
                if hasattr(p, "value") else p for p in self.points(name)}


@pytest.fixture
def m() -> Iterator[Metrics]:
    metrics = Metrics()
    yield metrics
    metrics.provider.shutdown()


def observe(m: Metrics, metric: names.Metric, callback: Callable[..., Any]) -> None:
    metric.create(m.meter, callbacks=[callback])


async def test_limiter_counts_refused_capacity_requests(
        m: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit_limiter, "_denials", names.RATELIMIT_DENIALS.create(m.meter))
    limiter, _store, _clock = limiter_for(rate=10.0)
    while await limiter.acquire("tw", Tier.P0) is None:
        pass
    assert await limiter.acquire("tw", Tier.P0) is not None  # blocked: not asked again
    assert m.values(names.RATELIMIT_DENIALS) == {
        (("provider", "tw"), ("scope", "provider"), ("tier", "P0")): 1}
    assert limiter.stats.denied == 1


async def test_limiter_counts_local_fallback_refusals(
        m: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit_limiter, "_denials", names.RATELIMIT_DENIALS.create(m.meter))
    limiter, store, _clock = limiter_for(rate=10.0)
    store.down = True
    limiter.rules.redis_down[Tier.P2] = "local"
    while await limiter.acquire("tw", Tier.P2, "acme", 1.0) is None:
        pass
    assert m.values(names.RATELIMIT_DENIALS) == {
        (("provider", "tw"), ("scope", "tenant"), ("tier", "P2")): 1}
    assert isinstance(limiter, CapacityLimiter)


async def test_limiter_reports_the_fill_of_each_tier(m: Metrics) -> None:
    limiter, _store, clock = limiter_for(rate=10.0)
    observe(m, names.RATELIMIT_FILL, ratelimit_limiter.observe_fill)
    assert await limiter.acquire("tw", Tier.P3) is None
    fill = m.values(names.RATELIMIT_FILL)[(("provider", "tw"), ("tier", "P3"))]
    assert fill == pytest.approx(9 / 10)
    while await limiter.acquire("tw", Tier.P3) is None:
        pass
    assert m.values(names.RATELIMIT_FILL)[(("provider", "tw"), ("tier", "P3"))] == 0.0
    clock.now += 5
    assert (("provider", "tw"), ("tier", "P3")) not in m.values(names.RATELIMIT_FILL)


def test_hold_records_lateness_and_oldest_retry(
        m: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "_lateness", names.SCHEDULER_LATENESS.create(m.meter))
    monkeypatch.setattr(steps, "_holds", type(steps._holds)())
    monkeypatch.setattr(steps, "_retry_tiers", set())
    observe(m, names.RETRY_OLDEST_AGE, steps.observe_retry_oldest)
    clock = [NOW + timedelta(seconds=30)]
    retry = work(attempt=2, not_before=(NOW + timedelta(seconds=40)).isoformat())
    scheduled = work(tier="P2", scheduled_at=(NOW + timedelta(seconds=35)).isoformat())
    hold = Hold(None, lambda: clock[0])
    other = Hold(None, lambda: clock[0])
    hold.on_item(retry)
    other.on_item(scheduled)
    ages = m.values(names.RETRY_OLDEST_AGE)
    assert ages[(("channel", "SMS"), ("tier", "P1"))] == 30.0
    assert ages[(("channel", "EMAIL"), ("tier", "P1"))] == 0.0
    assert all(dict(k)["tier"] == "P1" for k in ages)

    clock[0] = NOW + timedelta(seconds=42)
    out, _ = hold.on_notify()
    assert list(out) == [retry]
    out, _ = other.on_notify()
    assert list(out) == [scheduled]
    points = {dict(p.attributes)["timer"]: p for p in m.points(names.SCHEDULER_LATENESS)}
    assert points["retry"].sum == pytest.approx(2.0) and points["retry"].count == 1
    assert points["scheduled"].sum == pytest.approx(7.0)
    assert dict(points["retry"].attributes) == {"tier": "P1", "timer": "retry"}
    assert m.values(names.RETRY_OLDEST_AGE)[(("channel", "SMS"), ("tier", "P1"))] == 0.0


def test_hold_of_receipts_records_nothing(m: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "_lateness", names.SCHEDULER_LATENESS.create(m.meter))
    hold = Hold(None, lambda: NOW, due_of=lambda r: NOW - timedelta(seconds=1))
    out, _ = hold.on_item({"receipt": 1})
    assert list(out) == [{"receipt": 1}]
    assert m.points(names.SCHEDULER_LATENESS) == []


def test_parser_counts_direct_records_only(m: Metrics, monkeypatch: pytest.MonkeyPatch,
                                           settings: Settings) -> None:
    monkeypatch.setattr(steps, "_ingested", names.INGEST_MESSAGES.create(m.meter))
    parse(settings, kmsg(body()))
    parse(settings, kmsg(body(), offset=8))
    parse(settings, kmsg(body(message_id="msg_1", accepted_at=NOW.isoformat())))  # via API
    parse(settings, kmsg(body(attempt=2, message_id="msg_2", accepted_at=NOW.isoformat())))
    parse(settings, kmsg(b"{not json"))
    assert m.values(names.INGEST_MESSAGES) == {
        (("channel", "SMS"), ("source", "kafka"), ("tenant", "acme"), ("tier", "P1")): 2}


def stats(topic: str, part: int, ls: int, lo: int = 0) -> str:
    return json.dumps({"topics": {topic: {"partitions": {
        str(part): {"ls_offset": ls, "hi_offset": ls, "lo_offset": lo}}}}})


def test_kafka_partitions_report_lag(m: Metrics, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytewax_kafka, "_lags", {})
    observe(m, names.CONSUMER_LAG, bytewax_kafka.observe_lag)
    settings = Settings(topic_prefix="t1.", kafka_bootstrap="127.0.0.1:1")
    src = bytewax_kafka.kafka_source(settings, ["t1.ingest.sms.p1"], 10)
    part = src.build_part("send-p1.ingest", "3-t1.ingest.sms.p1", 40)
    try:
        assert isinstance(part, bytewax_kafka._LagPartition)
        group = part._group
        group._stats(stats("t1.ingest.sms.p1", 3, 55))
        assert m.values(names.CONSUMER_LAG) == {
            (("flow", "send-p1"), ("partition", 3), ("topic", "ingest.sms.p1")): 15}
        group._stats("{}")  # a statistics payload without the partition is ignored
        fresh = src.build_part("send-p1.ingest", "0-t1.ingest.sms.p1", None)
        assert fresh._group is group  # one consumer per source step and worker
        group._stats(stats("t1.ingest.sms.p1", 0, 9, lo=2))
        assert bytewax_kafka._lags[("send-p1", "ingest.sms.p1", 0)] == 7
        fresh.close()
        assert len(m.values(names.CONSUMER_LAG)) == 1
        assert bytewax_kafka._lags == {("send-p1", "ingest.sms.p1", 3): 15}
    finally:
        part.close()
    assert bytewax_kafka._lags == {}
