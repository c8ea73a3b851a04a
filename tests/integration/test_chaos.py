"""`notiflow chaos`'s short scenario set in the test command: the P1 send flow and the
priority-lane API SIGKILLed mid-stream, each on a platform of its own on the stack. Nothing
accepted is lost, no status regresses, and the platform catches up. The scenarios that stop
the stack's own Redis, Kafka or Cassandra stay out: the session's other processes share
them (after a Redis restart the session API refused P2 for a while: stale pooled
connections, see docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from notiflow.ops.chaos import SCENARIOS, run_scenario
from notiflow.settings import Settings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["kill-send-p1", "kill-api"])
def test_a_fault_loses_nothing(stack: Settings, tmp_path: Path, name: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    report = run_scenario(SCENARIOS[name], tmp_path, messages=200, rate=30, p0_rate=5,
                          seed=7, log=lambda _m: None, settle_timeout=150.0)
    with capsys.disabled():
        print(f"\n{report.as_dict()}")
    assert report.accepted >= 200
    assert (report.lost, report.regressions) == (0, 0)
    assert report.terminal == report.accepted
    assert report.recovered_after_s is not None
    assert report.p0_fault_samples > 0
