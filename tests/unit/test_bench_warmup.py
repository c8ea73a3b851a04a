"""The throughput benchmark's warm-up: the JIT compilers' CPU read from a /proc-like directory,
the rounds that repeat until the JVMs are warm, and what the report says of both."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from notiflow.bench import throughput
from notiflow.bench.harness import ProcSample, Sampler
from notiflow.bench.jvm import compiler_cpu_s
from notiflow.bench.report import throughput_markdown

TICK = os.sysconf("SC_CLK_TCK")


def _thread(root: Path, pid: int, tid: int, name: str, utime: int, stime: int) -> None:
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    rest = " ".join(["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0",
                     str(utime), str(stime), "0", "0", "20", "0", "1"])
    (task / "stat").write_text(f"{tid} ({name}) {rest}\n")


def test_compiler_cpu_counts_only_the_jit_threads(tmp_path: Path) -> None:
    _thread(tmp_path, 7, 7, "java", 900, 100)
    _thread(tmp_path, 7, 8, "C2 CompilerThre", 3 * TICK, TICK)
    _thread(tmp_path, 7, 9, "C1 CompilerThre", TICK // 2, 0)
    _thread(tmp_path, 7, 10, "ReadStage-1", 500, 500)
    _thread(tmp_path, 7, 11, "C2 Compiler (x)", 5 * TICK, 0)
    assert compiler_cpu_s(7, tmp_path) == pytest.approx(4 + (TICK // 2) / TICK)
    assert compiler_cpu_s(8, tmp_path) is None


def test_sampler_gives_the_jit_cpu_between_two_instants() -> None:
    s = Sampler()
    s.samples["cassandra"] = [ProcSample(10.0, 100.0, 1.0, 40.0),
                              ProcSample(11.0, 101.0, 1.0, 40.5),
                              ProcSample(20.0, 110.0, 1.0, 43.0)]
    s.samples["send-p2"] = [ProcSample(10.0, 5.0, 1.0, 0.0), ProcSample(20.0, 9.0, 1.0, 0.0)]
    assert s.jit_between("cassandra", 10.1, 19.9) == pytest.approx(3.0)
    assert s.jit_between("send-p2", 10.0, 20.0) == 0.0
    assert s.jit_between("kafka", 10.0, 20.0) == 0.0


class _Calls:
    """Stands in for the phases: round ``i``'s platform and minimal phases report JIT
    seconds that add up to ``shares[i]`` of their JVMs' CPU."""

    def __init__(self, shares: list[float]) -> None:
        self.shares = shares
        self.log: list[str] = []

    def _round(self) -> float:
        return self.shares[len([c for c in self.log if c.endswith("-e2e")]) - 1]

    def e2e(self, out: Path, run_id: str, n: int, *, name: str, log: Any) -> dict[str, Any]:
        self.log.append(f"{name}:{n}-e2e")
        return {"jit_s": 30 * self._round(), "jvm_cpu_s": 30.0}

    def ceiling(self, kind: str, out: Path, run_id: str, n: int, log: Any, *,
                name: str) -> dict[str, Any]:
        self.log.append(f"{name}:{n}")
        return {"jit_s": 10 * self._round(), "jvm_cpu_s": 10.0}

    def empty(self, out: Path, run_id: str) -> None:
        self.log.append("empty")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> _Calls:
    c = _Calls([0.45, 0.2, 0.04, 0.03])
    monkeypatch.setattr(throughput, "run_e2e", c.e2e)
    monkeypatch.setattr(throughput, "run_ceiling", c.ceiling)
    monkeypatch.setattr(throughput, "empty_tables", c.empty)
    return c


def test_warm_up_repeats_both_pipelines_until_the_jit_compilers_are_quiet(
        calls: _Calls, tmp_path: Path) -> None:
    warm, rounds = throughput.warm_up(tmp_path, "r", 1000, None, lambda _m: None,
                                      ceiling=True)
    assert warm == 500
    assert [r["jit_share"] for r in rounds] == [0.45, 0.2, 0.04]
    assert calls.log == ["empty", "warmup1:500-e2e", "warmup1-minimal:500",
                         "warmup2:500-e2e", "warmup2-minimal:500",
                         "warmup3:500-e2e", "warmup3-minimal:500", "empty"]


def test_warm_up_stops_after_its_rounds_and_can_be_skipped(calls: _Calls,
                                                           tmp_path: Path) -> None:
    _, rounds = throughput.warm_up(tmp_path, "r", 1000, 100, lambda _m: None, ceiling=False,
                                   rounds=2)
    assert len(rounds) == 2
    assert calls.log == ["empty", "warmup1:100-e2e", "warmup2:100-e2e", "empty"]
    calls.log.clear()
    assert throughput.warm_up(tmp_path, "r", 1000, 0, lambda _m: None, ceiling=True) == (0, [])
    assert calls.log == ["empty"]


def _doc(**extra: Any) -> dict[str, Any]:
    pipe = {"n": 10, "rate": 100.0, "steady_rate": 110.0, "cpu_ms_per_msg": 1.0,
            "cpu_by_process": {"x": 1.0}}
    return {"e2e": {**pipe, "procs": {}, "jit_ms_per_msg": {"cassandra": 0.04, "kafka": 0.01},
                    "jit_share": 0.05},
            "minimal": {**pipe, "jit_ms_per_msg": {"cassandra": 0.0, "kafka": 0.0},
                        "jit_share": 0.0},
            "passthrough": pipe, "ratio_minimal": 0.7, "ratio_passthrough": 0.1,
            "profile": {}, **extra}


def test_report_tells_how_the_jvms_were_warmed_and_what_they_compiled() -> None:
    md = throughput_markdown(_doc(warmup=500, warmup_rounds=[
        {"messages": 500, "jit_share": 0.31}, {"messages": 500, "jit_share": 0.08}]))
    assert "after 2 warm-up round(s) of 500 messages through each pipeline" in md
    assert "31%, 8%" in md
    assert "end to end cassandra 0.04, kafka 0.01 (5%)" in md
    assert "minimal pipeline cassandra 0.00, kafka 0.00 (0%)" in md
    old = throughput_markdown({**_doc(warmup=3000), "e2e": {**_doc()["e2e"],
                                                             "jit_ms_per_msg": {}}})
    assert "after 3000 messages through each pipeline to warm the JVMs" in old
