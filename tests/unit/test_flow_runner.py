"""The runner gives each flow its epoch: the tier's own (P0: 30 s) or ``flow_epoch_seconds``."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from notiflow.flows.common import runner
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(runner, "cli_main", lambda flow, **kw: calls.append(kw))
    monkeypatch.setattr(runner, "start_janitor", lambda path: threading.Event())
    monkeypatch.setattr(runner.telemetry, "setup", lambda *a, **kw: None)
    monkeypatch.setattr(runner.tuning, "settle", lambda: None)
    monkeypatch.setattr(runner.signal, "signal", lambda *a: None)
    return calls


def test_a_tier_epoch_overrides_the_flows_default(ran: list[dict[str, Any]],
                                                  tmp_path: Path) -> None:
    s = Settings(flow_epoch_seconds=5)
    runner.run_flow(object, s, "send-p0", recovery_dir=tmp_path / "p0",
                    epoch=s.policy(Tier.P0).epoch)
    runner.run_flow(object, s, "send-p3", recovery_dir=tmp_path / "p3",
                    epoch=s.policy(Tier.P3).epoch)
    assert [c["epoch_interval"] for c in ran] == [timedelta(seconds=30), timedelta(seconds=5)]
    assert len(list((tmp_path / "p0").glob("part-*.sqlite3"))) == s.recovery_partitions


def test_a_tier_epoch_is_set_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_TIERS", json.dumps({"P0": {
        "sla": 1, "ttl": 60, "retry": {"attempts": 2, "caps": [1], "span": 60},
        "epoch": 12}}))
    s = Settings()
    assert s.policy(Tier.P0).epoch == timedelta(seconds=12)
    assert s.policy(Tier.P1).epoch is None


def test_a_cluster_member_runs_with_its_id_and_addresses(ran: list[dict[str, Any]],
                                                         tmp_path: Path) -> None:
    """``-i``/``-a`` reach Bytewax, given directly or through a membership (a member that
    ran as a cluster of one over a shared store broke the store: ``exs`` rows clash)."""
    s = Settings()
    runner.run_flow(object, s, "send-p2", recovery_dir=tmp_path / "a",
                    members=runner.membership(s, 1, "h0:1;h1:2", None, 2101))
    runner.run_flow(object, s, "send-p2", recovery_dir=tmp_path / "b", process_id=0,
                    addresses="h0:1;h1:2")
    runner.run_flow(object, s, "send-p2", recovery_dir=tmp_path / "c")
    assert [(c["process_id"], c["addresses"]) for c in ran] == [
        (1, ["h0:1", "h1:2"]), (0, ["h0:1", "h1:2"]), (None, None)]
