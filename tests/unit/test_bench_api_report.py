"""``notiflow bench api``'s pure parts around the generator: the targets, the CPU snapshot, the
Markdown and PNG report and their publication."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from notiflow.bench.api import QUICK, Plan, cpu_now, targets_met
from notiflow.bench.api_report import api_markdown, platform_ms
from notiflow.bench.report import publish


def _step(offered: float, accepted: float, p99: float, server_ms: float = 4.0,
          bulk_ms: float = 0.1) -> dict[str, Any]:
    offered, accepted, p99 = float(offered), float(accepted), float(p99)
    return {"rate": offered, "requests": int(offered * 2), "offered_per_s": offered,
            "accepted": int(accepted * 2), "accepted_per_s": accepted, "window_s": 2.0,
            "p50_ms": p99 / 4, "p99_ms": p99, "max_ms": p99 * 2, "statuses": {"202": 1},
            "refused": {} if accepted == offered else {"503": 3}, "lag_p99_ms": 1.0,
            "lag_max_ms": 2.0, "capped": 0,
            "cpu_ms_per_msg": {"api": server_ms, "api-bulk": bulk_ms, "ceiling": 0.0,
                               "cassandra": 5.0, "kafka": 1.0, "redis": 0.2, "bench": 0.9}}


def _doc() -> dict[str, Any]:
    def mode(server: str, steps: list[dict[str, Any]], stop: str | None) -> dict[str, Any]:
        return {"server": server, "steps": steps, "stop": stop,
                "max_per_s": max(s["accepted_per_s"] for s in steps)}

    modes = {
        "ceiling": mode("ceiling", [_step(100, 100, 20), _step(200, 150, 900)], "accepted"),
        "batch-ceiling": mode("ceiling", [_step(400, 400, 50), _step(800, 500, 1500)], "p99"),
        "single-p0": mode("api", [_step(20, 20, 30), _step(40, 30, 2000)], "p99"),
        "p0-half": mode("api", [_step(15, 15, 40)], None),
        "single-p3": mode("api-bulk", [_step(20, 20, 30), _step(40, 40, 60)], None),
        "user-p3": mode("api-bulk", [_step(20, 20, 30), _step(40, 30, 1200, bulk_ms=0.25)],
                        "p99"),
        "batch-p3": mode("api-bulk", [_step(200, 200, 300), _step(400, 380, 1500)], "p99"),
    }
    return {"bench": "api", "run_id": "abc", "plan": asdict(Plan()), "modes": modes,
            "targets": targets_met(modes),
        "at_rest": {"cassandra": 0.04}, "processes": {"api": {"nice": -5, "realtime": True}}}


def test_targets_from_the_modes_maxima() -> None:
    t = _doc()["targets"]
    assert t["single_p0_over_ceiling"] == 0.2 and t["single_p3_over_ceiling"] == 0.267
    assert t["batch_over_single_p3"] == 9.5
    assert t["user_over_single_p3"] == 0.75 and t["user_cpu_over_single_p3"] == 2.5
    assert t["batch_over_batch_ceiling"] == 0.76 and t["batch_ceiling_over_single_p3"] == 12.5
    assert t["p0_half_rate"] == 15 and t["p0_half_p99_ms"] == 40 and t["p0_half_met"]
    assert t["saturated"] == {"ceiling": True, "batch-ceiling": True, "single-p0": True,
                              "single-p3": False, "user-p3": True, "batch-p3": True}
    assert targets_met({})["single_p0_over_ceiling"] is None


def test_the_quick_plan_is_short() -> None:
    q = QUICK
    per_mode = q.steps * (q.warmup_s + q.duration_s)
    assert per_mode <= 6 and q.prewarm_s == 0
    assert q.first_rate("batch-p3") == 10 * q.first_rate("single-p0")
    assert Plan(starts={"ceiling": 80}).first_rate("ceiling") == 80


def test_cpu_now_leaves_out_a_process_that_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = psutil.Process(child.pid)
    child.wait()
    snap = cpu_now({"me": psutil.Process(), "gone": gone})
    assert set(snap) == {"me"} and snap["me"] > 0


def test_markdown_and_published_report(tmp_path: Path) -> None:
    doc = _doc()
    md = api_markdown(doc)
    assert "| single P0 accepted/s ÷ ceiling | 20% | ≥ 50 % |" in md
    assert "| batch P3 ÷ single P3, messages/s | 9.5x | ≥ 10x |" in md
    assert "| P0 p99 at half its maximum (15.0/s) | 40.0 ms | ≤ 50 ms |" in md
    assert "Not saturated (every rate ran; the maximum is a lower bound): single-p3." in md
    assert "| single-p0 | 40.0 | 30.0 | 500 | 2,000 | 4,000 | 503: 3 |" in md
    assert platform_ms(doc["modes"]["ceiling"]["steps"][0]["cpu_ms_per_msg"]) == 10.3
    paths = publish(doc, tmp_path / "api-r1")
    assert [p.name for p in paths] == ["api-r1.json", "api-r1.md", "api-r1.png"]
    assert paths[2].stat().st_size > 10_000
    assert json.loads(paths[0].read_text())["modes"] == doc["modes"]
