"""A smoke run of ``notiflow bench api`` on the real stack (the quick plan: two short steps
per mode): every mode accepts, and the report has its shape (the figures are not judged
here; see bench/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from notiflow.bench import api
from notiflow.bench.api_report import api_markdown, api_plot
from notiflow.bench.report import write
from notiflow.settings import Settings

pytestmark = pytest.mark.integration


def test_bench_api_smoke(stack: Settings, tmp_path: Path) -> None:
    doc = api.run(tmp_path, plan=api.QUICK, modes=list(api.MODES), log=print)
    assert list(doc["modes"]) == ["ceiling", "batch-ceiling", "single-p0", "p0-half",
                                  "single-p3", "user-p3", "batch-p3"]
    for name, mode in doc["modes"].items():
        assert mode["server"] == api.SERVER[name]
        assert mode["max_per_s"] > 0 and mode["steps"], name
        for step in mode["steps"]:
            assert step["accepted"] > 0 and step["requests"] > 0, (name, step)
            assert 0 < step["p50_ms"] <= step["p99_ms"] <= step["max_ms"], (name, step)
            assert step["cpu_ms_per_msg"][mode["server"]] > 0, (name, step)
            assert {"cassandra", "kafka", "redis", "bench"} <= step["cpu_ms_per_msg"].keys()
        first = mode["steps"][0]
        assert first["refused"] == {}, (name, first)
    for batch in ("batch-ceiling", "batch-p3"):
        assert doc["modes"][batch]["steps"][0]["statuses"] == {
            "200": doc["modes"][batch]["steps"][0]["requests"]}
    assert len(doc["modes"]["single-p0"]["steps"]) == api.QUICK.steps
    assert doc["modes"]["p0-half"]["steps"][0]["rate"] == pytest.approx(
        doc["modes"]["single-p0"]["max_per_s"] / 2, abs=0.1)
    targets = doc["targets"]
    assert targets["single_p0_over_ceiling"] > 0 and targets["batch_over_single_p3"] > 0
    assert targets["p0_half_p99_ms"] > 0 and targets["batch_ceiling_over_single_p3"] > 0
    assert targets["user_over_single_p3"] > 0 and targets["user_cpu_over_single_p3"] > 0
    assert doc["processes"]["api"] and "cassandra" in doc["at_rest"]
    md = api_markdown(doc)
    paths = write(tmp_path, "api", doc, md)
    assert json.loads(paths[0].read_text())["bench"] == "api"
    assert api_plot(doc, tmp_path / "api.png").stat().st_size > 10_000
    assert "## Targets" in md and "## Steps" in md
