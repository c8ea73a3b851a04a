"""The benchmarks' CPU readings: a process with its worker children, and the wait before
``p0-half`` for the stack to be quiet (driven by a fake clock: no real sleeping)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import psutil

from notiflow.bench.api import Plan
from notiflow.bench.api_report import api_markdown
from notiflow.bench.proc_cpu import cpu_now, tree_cpu_s, wait_quiet
from tests.fakes import SleepingClock


@dataclass
class FakeProc:
    pid: int
    cpu: float
    kids: list[FakeProc] = field(default_factory=list)
    gone: bool = False

    def cpu_times(self) -> Any:
        if self.gone:
            raise psutil.NoSuchProcess(self.pid)
        return SimpleNamespace(user=self.cpu * 0.75, system=self.cpu * 0.25)

    def children(self) -> list[FakeProc]:
        return list(self.kids)


def _p(proc: FakeProc) -> psutil.Process:
    return cast(psutil.Process, proc)


def test_a_process_counts_with_its_live_descendants() -> None:
    grandchild = FakeProc(13, 0.5)
    workers = [FakeProc(11, 2.0, [grandchild]), FakeProc(12, 3.0), FakeProc(14, 9.0, gone=True)]
    supervisor = FakeProc(10, 1.0, workers)
    assert tree_cpu_s(_p(supervisor)) == 6.5
    assert tree_cpu_s(_p(supervisor), skip={11}) == 4.0  # 11 is watched: with its subtree


def test_each_watched_process_keeps_its_own_subtree() -> None:
    api = FakeProc(21, 1.0, [FakeProc(22, 2.0)])
    parent = FakeProc(20, 0.5, [api])
    snap = cpu_now({"parent": _p(parent), "api": _p(api), "gone": _p(FakeProc(30, 1, gone=True))})
    assert snap == {"parent": 0.5, "api": 3.0}


def test_this_process_counts_alone() -> None:
    me = FakeProc(os.getpid(), 1.0, [FakeProc(41, 5.0)])
    assert tree_cpu_s(_p(me)) == 1.0


def _sampler(clock: SleepingClock, shares: dict[str, Callable[[float], float]]
             ) -> Callable[[], dict[str, float]]:
    """Cumulative CPU seconds of each process whose share of a core at ``t`` seconds after
    the start is ``shares[name](t)`` (constant over each second)."""
    start = clock.now
    used = dict.fromkeys(shares, 0.0)
    last = {"t": 0.0}

    def sample() -> dict[str, float]:
        t = clock.now - start
        while last["t"] < t:
            for name, share in shares.items():
                used[name] += share(last["t"])
            last["t"] += 1.0
        return dict(used)

    return sample


def test_waits_until_cassandra_and_kafka_are_near_their_rest() -> None:
    clock = SleepingClock(100.0)
    sample = _sampler(clock, {"cassandra": lambda t: 1.0 if t < 5 else 0.6,
                              "kafka": lambda t: 0.3 if t < 3 else 0.05,
                              "api": lambda _t: 1.0})
    quiet = wait_quiet(sample, {"cassandra": 0.54, "kafka": 0.02}, clock=clock,
                       sleep=clock.sleep)
    assert quiet == {"waited_s": 6.0, "timed_out": False, "busy": [],
                     "cpu": {"cassandra": 0.6, "kafka": 0.05}}
    assert clock.slept == [1.0] * 6


def test_gives_up_after_the_timeout() -> None:
    clock = SleepingClock(100.0)
    sample = _sampler(clock, {"cassandra": lambda _t: 0.9, "kafka": lambda _t: 0.0})
    quiet = wait_quiet(sample, {"cassandra": 0.1}, timeout_s=90, clock=clock,
                       sleep=clock.sleep)
    assert quiet["timed_out"] and quiet["waited_s"] == 90.0
    assert quiet["cpu"] == {"cassandra": 0.9, "kafka": 0.0}


def test_a_process_not_sampled_is_not_waited_for() -> None:
    clock = SleepingClock(100.0)
    sample = _sampler(clock, {"cassandra": lambda _t: 0.1})
    quiet = wait_quiet(sample, {}, clock=clock, sleep=clock.sleep)
    assert quiet == {"waited_s": 1.0, "timed_out": False, "cpu": {"cassandra": 0.1},
                     "busy": []}


def test_waits_for_background_work_once_the_cpu_is_calm() -> None:
    clock = SleepingClock(100.0)
    sample = _sampler(clock, {"cassandra": lambda _t: 0.1})
    asked: list[float] = []

    def busy() -> list[str]:
        asked.append(clock.now)
        return ["compaction of notiflow_bench.messages"] if clock.now < 104 else []

    quiet = wait_quiet(sample, {}, clock=clock, sleep=clock.sleep, busy=busy)
    assert quiet["waited_s"] == 4.0 and not quiet["timed_out"] and quiet["busy"] == []
    assert asked == [101.0, 102.0, 103.0, 104.0]
    stuck = wait_quiet(sample, {}, clock=clock, sleep=clock.sleep, timeout_s=3,
                       busy=lambda: ["MemtableFlushWriter: 1 active, 0 pending"])
    assert stuck["timed_out"] and stuck["busy"] == ["MemtableFlushWriter: 1 active, 0 pending"]


def test_the_report_names_the_processes_and_the_wait() -> None:
    step = {"offered_per_s": 15.0, "accepted_per_s": 15.0, "p50_ms": 5.0, "p99_ms": 40.0,
            "max_ms": 60.0, "refused": {}, "capped": 0, "lag_p99_ms": 1.0,
            "cpu_ms_per_msg": {}}
    doc: dict[str, Any] = {"plan": asdict(Plan()), "api_processes": 2, "modes": {"p0-half": {
        "server": "api", "steps": [step], "stop": None, "max_per_s": 15.0,
        "quiet": {"waited_s": 12.0, "timed_out": False, "cpu": {"cassandra": 0.61}}}}}
    md = api_markdown(doc)
    assert "API processes per lane: 2" in md
    assert "waited 12 s for the stack to be quiet" in md and "cassandra 0.61" in md
    doc["modes"]["p0-half"]["quiet"] = {"waited_s": 90.0, "timed_out": True, "cpu": {}}
    assert "timed out" in api_markdown(doc)
