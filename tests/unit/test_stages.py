"""The latency budget: stage timing in the API (``Server-Timing``), the bench's reading of the
exported histograms (quantiles, per-stage budget, stall intervals) and of JVM pause logs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow import names
from notiflow.bench import jvm
from notiflow.bench.otlp import StagePoint, budget, quantile, stalls
from notiflow.names import Stage
from notiflow.stages import StageTimes

BOUNDS = names.STAGE_BUCKETS


def test_server_timing_lists_stages_in_order_in_milliseconds() -> None:
    times = StageTimes("P0")
    times.add(Stage.API_RESERVE, 0.0031)
    times.add(Stage.API_WRITE, 0.002)
    times.add(Stage.API_RESERVE, 0.001)
    times.add(Stage.API_SETTLE, -1.0)
    assert times.server_timing() == "api.reserve;dur=4.1, api.write;dur=2.0, api.settle;dur=0.0"


def test_timing_counts_a_block_that_raises() -> None:
    times = StageTimes("P0")
    with pytest.raises(ValueError), times.timing(Stage.API_TEMPLATE):
        raise ValueError
    assert Stage.API_TEMPLATE in times.seconds


def test_every_stage_is_a_unique_dotted_name() -> None:
    values = [s.value for s in Stage]
    assert len(values) == len(set(values))
    assert all(v.replace(".", "").replace("_", "").isalpha() for v in values)


def counts_of(samples: list[float]) -> list[int]:
    counts = [0] * (len(BOUNDS) + 1)
    for x in samples:
        i = next((k for k, b in enumerate(BOUNDS) if x <= b), len(BOUNDS))
        counts[i] += 1
    return counts


@given(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=300), st.floats(0.01, 0.99))
def test_quantile_lies_in_the_bucket_of_the_exact_quantile(samples: list[float],
                                                           q: float) -> None:
    got = quantile(BOUNDS, counts_of(samples), q)
    exact = sorted(samples)[max(0, min(len(samples) - 1, math.ceil(q * len(samples)) - 1))]
    i = next((k for k, b in enumerate(BOUNDS) if exact <= b), len(BOUNDS) - 1)
    lo = 0.0 if i == 0 else BOUNDS[i - 1]
    assert lo - 1e-9 <= got <= BOUNDS[i] + 1e-9


def point(stage: str, end: float, samples: list[float], tier: str = "P0") -> StagePoint:
    return StagePoint("notiflow-api", tier, stage, end, len(samples), sum(samples),
                      max(samples), BOUNDS, tuple(counts_of(samples)))


def test_budget_merges_intervals_per_stage_and_keeps_the_exact_max() -> None:
    points = [point("api.reserve", 101.0, [0.004] * 99), point("api.reserve", 102.0, [0.61]),
              point("kafka", 102.0, [0.002] * 10), point("kafka", 103.0, [0.003], tier="P3"),
              point("kafka", 50.0, [9.0])]
    got = budget(points, "P0", t0=100.0, t1=110.0)
    assert list(got) == ["api.reserve", "kafka"]
    assert got["api.reserve"]["count"] == 100
    assert got["api.reserve"]["max_ms"] == 610.0
    assert 3.0 <= got["api.reserve"]["p50_ms"] <= 5.0
    assert got["kafka"]["max_ms"] == 2.0


def test_stalls_name_the_interval_and_the_stage() -> None:
    points = [point("dispatch.route", 130.5, [0.01, 1.2]), point("provider", 131.0, [0.1])]
    assert stalls(points, "P0", t0=100.0) == [(30.5, "dispatch.route", 1200.0)]


def test_jvm_pauses_from_the_safepoint_log(tmp_path: Path) -> None:
    log = tmp_path / "cassandra-gc.log"
    log.write_text(
        "[2026-12-01T08:00:00.000+0000][1ms] Using G1\n"
        '[2026-12-01T08:00:10.500+0000][10500ms] Safepoint "G1CollectForAllocation", Time '
        "since last: 1000 ns, Reaching safepoint: 2000 ns, At safepoint: 120000000 ns, "
        "Total: 120002000 ns\n"
        '[2026-12-01T08:00:11.000+0000][11000ms] Safepoint "Cleanup", Time since last: 1 ns, '
        "Reaching safepoint: 1 ns, At safepoint: 1000 ns, Total: 1001 ns\n")
    from datetime import UTC, datetime

    t0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=UTC).timestamp()
    s = jvm.summary(log, t0, t0 + 60)
    assert s["pauses"] == 2 and s["max_ms"] == 120.0
    assert s["long"] == [(10.5, 120.0, "G1CollectForAllocation")]
