"""Benchmark summaries (``notiflow.bench.summary``): what ``bench/figures/`` keeps of a run
renders the same report as the run's full JSON, without its per-message and per-sample series."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from notiflow.bench import host
from notiflow.bench.report import isolation_plot, markdown, publish
from notiflow.bench.summary import (
    LATENCY_COLUMNS,
    MAX_WINDOWS,
    dumps,
    latency_windows,
    pressure_windows,
    summarize,
)

MACHINE = {"cpus": 2, "memory_gb": 24, "python": "3.11.7", "system": "Linux-6.18"}


def _host_rows(seconds: int, rng: random.Random) -> list[dict[str, float]]:
    keys = ("cpu_some_ms", "io_some_ms", "io_full_ms", "memory_some_ms", "write_mb",
            "write_busy_ms", "read_mb", "read_busy_ms", "dirty_mb", "writeback_mb")
    return [{"t": t + 0.5, **{k: round(rng.uniform(0, 900), 1) for k in keys}}
            for t in range(seconds)]


def _mode(mode: str, seconds: int, rng: random.Random) -> dict[str, Any]:
    """One mode as ``isolation.run_mode`` writes it to bench/results/, raw series included."""
    p0 = [(round(i / 20, 3), round(rng.lognormvariate(4, 0.6), 1)) for i in range(seconds * 20)]
    p3 = [(round(i / 50, 3), round(1000 + i * 3.5, 1)) for i in range(seconds * 50)]
    rows = _host_rows(seconds, rng)
    stalls = [(12.0, "provider", 310.5), (40.0, "admission", 420.0), (41.0, "provider", 260.0)]
    held = [(11.5, "cassandra/MemtableFlushWriter jbd2_log_wait_commit"),
            (40.2, "kafka/data-plane-kafka-request-handler folio_wait_bit")]
    procs = {name: {"cpu_s": 12.5, "rss_start_mb": 100.0, "rss_mid_mb": 101.0,
                    "rss_end_mb": 101.5, "rss_max_mb": 103.0,
                    "rss_tenths_mb": [100.0 + i / 10 for i in range(11)]}
             for name in ("send-p0", "send-p3", "cassandra")}
    stage = {"count": 400, "mean_ms": 12.1, "p50_ms": 8.0, "p99_ms": 95.0, "max_ms": 310.5}
    return {
        "mode": mode, "n": len(p3), "otp_rate": 20.0, "drained": True, "wall_s": seconds,
        "produce_rate": 2500,
        "p0": {"n": len(p0), "p50": 55.0, "p99": 410.0, "max": 900.0, "sent": len(p0),
               "refused": 0, "missing": 0},
        "p3": {"n": len(p3), "p50": 9000.0, "p99": 17000.0, "max": 18000.0, "missing": 0,
               "drain_s": float(seconds), "drain_rate": 50},
        "timeline": {"p0": p0, "p3": p3},
        "latency": latency_windows({"p0": p0, "p3": p3}),
        "processes": procs,
        "warmup": {"seconds": 30.0, "otps": 400, "p3": 900,
                   "waves": [{"p50_ms": 40.0, "p99_ms": 200.0, "seconds": 10.0}]},
        "cpu_timeline": {name: [(t + 1.0, 0.4) for t in range(seconds)] for name in procs},
        "jvm_pauses": {"cassandra": {"pauses": 30, "total_ms": 120.0, "max_ms": 61.0,
                                     "long": [(33.0, 61.0, "G1CollectForAllocation")]}},
        "host": {"summary": host.summary(rows), "timeline": rows,
                 "blocked": host.blocked_summary(held),
                 "speed": {"before": {"rounds": 80_000, "per_wall_s": 79_000,
                                      "per_cpu_s": 80_000},
                           "after": {"rounds": 70_000, "per_wall_s": 69_000,
                                     "per_cpu_s": 70_000}},
                 "at_stalls": host.at_stalls(rows, stalls, 2, held)},
        "budget_recorded": True,
        "budget": {"P0": {"admission": stage, "provider": stage}, "P3": {"provider": stage}},
        "stalls": stalls,
        "gc_pauses": {"notiflow-send-p3": {"collections": 80, "total_ms": 300.0,
                                           "max_ms": 52.0, "long": [(20.0, 52.0)]}},
        "bulk_window": {"samples": 3, "share_yielding": 0.333, "min": 0.5, "mean": 0.833,
                        "timeline": [(0.0, 1.0), (2.0, 0.5), (4.0, 1.0)]},
    }


@pytest.fixture
def isolation_doc() -> dict[str, Any]:
    rng = random.Random(4)
    return {"bench": "isolation", "run_id": "abc123",
            "modes": {"tiered": _mode("tiered", 120, rng), "shared": _mode("shared", 90, rng)},
            "p0_p99_ratio_shared_over_tiered": 1.0, "machine": MACHINE}


@pytest.fixture
def soak_doc() -> dict[str, Any]:
    return {"bench": "soak", "run_id": "def456", "minutes": 2, "p3_rate": 50.0,
            "cap_window_s": 60.0, "modes": {"soak": _mode("tiered", 120, random.Random(5))},
            "machine": MACHINE}


def _raw_free(doc: dict[str, Any]) -> None:
    for r in doc["modes"].values():
        assert "timeline" not in r and "cpu_timeline" not in r
        assert "timeline" not in r["host"]
        assert r["latency"]["columns"] == list(LATENCY_COLUMNS)
        assert r["host"]["pressure"]["rows"]


def test_a_summary_drops_the_raw_series(isolation_doc: dict[str, Any]) -> None:
    full_size = len(json.dumps(isolation_doc))
    brief = summarize(isolation_doc)
    _raw_free(brief)
    assert brief["summary"]["dropped"] == [
        f"modes.{m}.{k}" for m in ("tiered", "shared")
        for k in ("timeline", "cpu_timeline", "host.timeline")]
    assert len(dumps(brief)) < full_size / 3
    assert "timeline" in isolation_doc["modes"]["tiered"], "the input is left alone"


@pytest.mark.parametrize("kind", ["isolation_doc", "soak_doc"])
def test_the_report_renders_the_same_from_the_summary(kind: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    full: dict[str, Any] = request.getfixturevalue(kind)
    brief = summarize(full)
    assert markdown(brief) == markdown(full)
    assert "Machine while P0 stalled" in markdown(brief)
    assert "Threads waiting in uninterruptible sleep" in markdown(brief)
    from_full = isolation_plot(full, tmp_path / "full.png").read_bytes()
    from_brief = isolation_plot(json.loads(dumps(brief)), tmp_path / "brief.png").read_bytes()
    assert from_full == from_brief


def test_summaries_without_raw_series_keep_every_field() -> None:
    pipe = {"n": 10, "rate": 100.0, "steady_rate": 110.0, "cpu_ms_per_msg": 1.0,
            "cpu_by_process": {"x": 1.0}}
    throughput = {"bench": "throughput", "e2e": {**pipe, "procs": {}}, "minimal": pipe,
                  "passthrough": pipe, "ratio_minimal": 1.0, "ratio_passthrough": 1.0,
                  "profile": {}, "machine": MACHINE}
    scale = {"bench": "scale", "runs": [{"processes": 1, "steady_rate": 100.0, "rate": 90.0,
                                         "cpu_ms_per_msg": 1.0}], "machine": MACHINE}
    for doc in (throughput, scale):
        brief = summarize(doc)
        assert {k: v for k, v in brief.items() if k != "summary"} == doc
        assert brief["summary"] == {"dropped": []}
        assert markdown(brief) == markdown(doc)


def test_summarize_is_idempotent(isolation_doc: dict[str, Any], soak_doc: dict[str, Any]
                                 ) -> None:
    for doc in (isolation_doc, soak_doc):
        brief = summarize(doc)
        assert summarize(brief) == brief
        assert json.loads(dumps(brief)) == brief
        assert summarize(json.loads(dumps(brief))) == brief


def test_stored_windows_win_over_a_thinned_timeline(isolation_doc: dict[str, Any]) -> None:
    """A run's JSON thins P3's timeline but stores the windows of every message; an older
    JSON without them gets windows of its sample, marked as such."""
    r = isolation_doc["modes"]["tiered"]
    stored = r["latency"]
    r["timeline"]["p3"] = r["timeline"]["p3"][::7]
    assert summarize(isolation_doc)["modes"]["tiered"]["latency"] == stored
    del r["latency"]
    rebuilt = summarize(isolation_doc)["modes"]["tiered"]["latency"]
    assert rebuilt["sampled"] == ["p3"]
    assert rebuilt["tiers"]["p0"] == stored["tiers"]["p0"]


def test_latency_windows() -> None:
    got = latency_windows({"p0": [(0.2, 10.0), (0.9, 30.0), (0.5, 20.0), (2.1, 5.0)],
                           "p3": []})
    assert got["window_s"] == 1
    assert got["tiers"] == {"p0": [[0, 3, 10.0, 20.0, 30.0, 30.0], [2, 1, 5.0, 5.0, 5.0, 5.0]],
                            "p3": []}
    long = latency_windows({"p0": [(t / 10, 1.0) for t in range(18_000)]})
    assert long["window_s"] == 3 and len(long["tiers"]["p0"]) <= MAX_WINDOWS
    assert sum(row[1] for row in long["tiers"]["p0"]) == 18_000


def test_pressure_windows_average_consecutive_samples() -> None:
    rows = [{"t": float(t), "cpu_some_ms": float(t), "io_some_ms": 2.0, "io_full_ms": 0.0}
            for t in range(1, 1301)]
    got = pressure_windows(rows)
    assert got["samples_per_row"] == 3 and len(got["rows"]) <= MAX_WINDOWS
    assert got["rows"][0] == [3.0, 2.0, 2.0, 0.0]
    assert got["rows"][-1] == [1300.0, 1300.0, 2.0, 0.0]
    assert pressure_windows(rows[:5])["rows"][1] == [2.0, 2.0, 2.0, 0.0]


def test_publish_and_the_cli_write_the_summary_and_its_report(
        isolation_doc: dict[str, Any], tmp_path: Path) -> None:
    from notiflow.bench.cli import bench_app

    paths = publish(isolation_doc, tmp_path / "figures" / "iso")
    assert [p.name for p in paths] == ["iso.json", "iso.md", "iso.png"]
    brief = json.loads(paths[0].read_text())
    _raw_free(brief)
    assert paths[1].read_text() == markdown(isolation_doc)
    assert paths[1].read_text().endswith(f"\nMachine: {MACHINE}\n")

    src = tmp_path / "results" / "isolation.json"
    src.parent.mkdir()
    src.write_text(json.dumps(isolation_doc, indent=1))
    result = CliRunner().invoke(bench_app, ["summarize", str(src),
                                            str(tmp_path / "out" / "iso.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "iso.json").read_text()) == brief
    assert (tmp_path / "out" / "iso.png").read_bytes() == paths[2].read_bytes()
    assert (tmp_path / "out" / "iso.md").read_text() == paths[1].read_text()
