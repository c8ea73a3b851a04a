"""A smoke run of every benchmark with a small N on the real stack: it keeps ``notiflow bench``
working (the figures themselves are not judged here; see bench/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notiflow.bench import isolation, throughput
from notiflow.bench.report import isolation_markdown, isolation_plot, throughput_markdown, write
from notiflow.bench.scheduler_report import scheduler_markdown, scheduler_plot
from notiflow.settings import Settings

pytestmark = pytest.mark.integration


@pytest.mark.solo
def test_isolation_smoke(stack: Settings, tmp_path: Path) -> None:
    doc = isolation.run(tmp_path, n=150, otp_rate=5, modes=["tiered", "shared"],
                        max_drain=180, log=print, warmup=0)
    budget = doc["modes"]["tiered"]["budget"]["P0"]
    assert {"api.reserve", "api.accept", "kafka", "flow", "dispatch.prepare",
            "provider"} <= budget.keys(), budget
    assert all(b["count"] > 0 and b["p50_ms"] <= b["p99_ms"] for b in budget.values())
    assert doc["modes"]["tiered"]["budget"]["P3"]["provider"]["count"] >= 150
    assert doc["modes"]["tiered"]["warmup"]["waves"]
    assert "cassandra" in doc["modes"]["tiered"]["jvm_pauses"]
    for mode in ("tiered", "shared"):
        r = doc["modes"][mode]
        assert r["drained"], mode
        assert r["p3"]["missing"] == 0 and r["p3"]["n"] == 150
        assert r["p0"]["sent"] > 0 and r["p0"]["missing"] == 0 and r["p0"]["refused"] == 0
        assert 0 < r["p0"]["p50"] <= r["p0"]["p99"] <= r["p0"]["max"]
        assert {"send-p0", "send-p3"} <= r["processes"].keys() if mode == "tiered" else True
    assert doc["p0_p99_ratio_shared_over_tiered"] > 0
    paths = write(tmp_path, "isolation", doc, isolation_markdown(doc))
    png = isolation_plot(doc, tmp_path / "isolation.png")
    assert json.loads(paths[0].read_text())["machine"]["cpus"] >= 1
    assert png.stat().st_size > 10_000


def test_throughput_and_scale_smoke(stack: Settings, tmp_path: Path) -> None:
    doc = throughput.run(tmp_path, n=150, profile=True, log=print, warmup=0)
    assert doc["e2e"]["status_written"] == 150 and doc["e2e"]["provider_done"]
    assert doc["minimal"]["n"] == 150 and doc["passthrough"]["n"] == 150
    assert doc["minimal"]["outcomes"] == {"accepted": 150}
    assert doc["ratio_minimal"] > 0 and 0 < doc["ratio_passthrough"] < 1
    assert doc["profile"]["send-p2"]["stages"], "py-spy saw the send flow"
    assert "Profile of send-p2" in throughput_markdown(doc)
    assert set(doc["e2e"]["jit_ms_per_msg"]) == {"kafka", "cassandra"}
    assert doc["warmup_rounds"] == []
    for phase in ("e2e", "minimal"):
        assert doc[phase]["machine_cpu_ms_per_msg"] > 0
        assert 0 <= doc[phase]["machine_idle_share"] < 1
    assert "The whole machine during each measured phase" in throughput_markdown(doc)
    scale = throughput.run_scale(tmp_path, n=100, processes=[2], log=print, warmup=0)
    assert [r["processes"] for r in scale["runs"]] == [2]
    assert all(r["status_written"] == 100 and r["rate"] > 0 for r in scale["runs"])


def test_a_phase_drops_only_its_own_redis_keys(stack: Settings) -> None:
    import redis

    from notiflow.bench.harness import drop_keys

    mine = stack.model_copy(update={"topic_prefix": "bench-drop-test-a-"})
    other = "bench-drop-test-b-lease:1"
    client = redis.Redis.from_url(stack.redis_url)
    try:
        client.mset({f"bench-drop-test-a-lease:{i}": "x" for i in range(2500)} | {other: "y"})
        assert drop_keys(mine, batch=1000) == 2500
        assert client.get(other) == b"y"
        assert not list(client.scan_iter(match="bench-drop-test-a-*"))
        with pytest.raises(ValueError):
            drop_keys(stack.model_copy(update={"topic_prefix": ""}))
    finally:
        client.delete(other)
        client.close()


def test_scheduler_smoke(stack: Settings, tmp_path: Path) -> None:
    from notiflow.bench import scheduler

    doc = scheduler.run(tmp_path, n=200, rate=100, failover_n=40, window=8, log=print, lead=4.0)
    for phase in ("failover", "load"):
        r = doc[phase]
        assert r["lost"] == 0 and r["early"] == 0, (phase, r)
        assert r["lateness_p99_s"] is not None and r["lateness_p99_s"] < 10, (phase, r)
    assert doc["load"]["scheduler_cpu_ms_per_row"] > 0
    assert doc["load"]["slices"]
    write(tmp_path, "scheduler", doc, scheduler_markdown(doc))
    assert scheduler_plot(doc, tmp_path / "scheduler.png").stat().st_size > 10_000
