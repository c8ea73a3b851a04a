"""The CPU priority of a process: niceness and the real-time class, with their fallbacks."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from notiflow import tuning
from notiflow.ops.stack.jvm import prioritise_collector
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings


def test_realtime_zero_leaves_the_scheduler_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("must not be called")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    assert tuning.set_realtime(0) is False


def test_realtime_asks_for_round_robin_at_the_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "sched_setscheduler",
                        lambda pid, policy, param: calls.append(
                            (pid, policy, param.sched_priority)))
    assert tuning.set_realtime(3) is True
    assert calls == [(0, os.SCHED_RR, 3)]


def test_realtime_without_the_capability_falls_back(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    def denied(*_: object) -> None:
        raise PermissionError("Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", denied)
    assert tuning.set_realtime(1) is False
    assert "normal scheduler" in caplog.text


def test_lanes_take_their_tiers_priorities() -> None:
    s = Settings()
    assert s.policy(Tier.P0).realtime >= 1
    assert s.lane_realtime("priority") == s.policy(Tier.P0).realtime
    assert s.lane_realtime("bulk") == 0
    assert s.lane_realtime("all") == 0
    assert s.lane_nice("bulk") == min(s.policy(t).nice for t in (Tier.P2, Tier.P3))


def test_only_a_jvms_stop_the_world_threads_are_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads named as the JVM names its collector workers and VM thread are moved; the
    concurrent marker and every other thread are not."""
    named: dict[str, int] = {}
    ready = threading.Barrier(4)
    done = threading.Event()

    def idle(comm: str) -> None:
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(comm)
        named[comm] = threading.get_native_id()
        ready.wait()
        done.wait()

    threads = [threading.Thread(target=idle, args=(c,), daemon=True)
               for c in ("GC Thread#7", "VM Thread", "G1 Conc#0")]
    for t in threads:
        t.start()
    ready.wait()
    moved: list[tuple[int, int, int]] = []
    monkeypatch.setattr(os, "sched_setscheduler", lambda tid, policy, param: moved.append(
        (tid, policy, param.sched_priority)))
    try:
        assert prioritise_collector(os.getpid(), 2) == 2
    finally:
        done.set()
    assert sorted(moved) == sorted([(named["GC Thread#7"], os.SCHED_RR, 2),
                                    (named["VM Thread"], os.SCHED_RR, 2)])
