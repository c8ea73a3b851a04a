"""A flow member found in DNS stops itself when its cluster is rescaled: the watcher thread
of ``flows/common/runner.py`` runs beside a real Bytewax worker and its SIGTERM ends the flow at its
epoch (Kubernetes then starts it with the new member list; docs/kubernetes.md). DNS is the
one part replaced: the resolver sees a second member appear after two seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.flow
REPO = Path(__file__).resolve().parents[2]

MEMBER = '''
import sys, time
from datetime import timedelta
from pathlib import Path

from notiflow.adapters.cluster_peers import ClusterSpec
from notiflow.flows.common import runner
from notiflow.settings import Settings
from tests.idle_flow import build

started = time.monotonic()
runner.dns_resolves = lambda host: host.startswith("idle-0.") or (
    host.startswith("idle-1.") and time.monotonic() - started > 2)
spec = ClusterSpec("idle", 0, "idle.test.svc.cluster.local", 2101, 4)
settings = Settings(stack_dir=Path(sys.argv[1]), cluster_watch_seconds=0.3,
                    telemetry={"exporter": "off"})
runner.run_flow(build, settings, "idle", members=runner.Membership(spec=spec),
                epoch=timedelta(seconds=1))
print("EXITED", round(time.monotonic() - started, 1), flush=True)
'''


def test_a_rescale_stops_the_running_member(tmp_path: Path) -> None:
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "stack")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    elapsed = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EXITED" in done.stdout
    assert "rescaled from 1 to 2 members" in done.stdout + done.stderr
    assert elapsed < 30
    assert any((tmp_path / "stack" / "recovery" / "idle").glob("part-*.sqlite3"))
