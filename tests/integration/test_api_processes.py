"""``notiflow api --processes 2`` against the real stack: two supervised workers share the
port, a killed worker is replaced, SIGTERM to the supervisor stops every worker."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import psutil
import pytest

from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.settings import Settings
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def workers(supervisor: psutil.Process) -> list[psutil.Process]:
    """The supervisor's live worker processes (not multiprocessing's resource tracker)."""
    out = []
    for child in supervisor.children():
        try:
            if "spawn_main" in " ".join(child.cmdline()) and child.is_running():
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def requests_succeed(base: str, token: str, n: int = 20) -> None:
    """``n`` readiness checks and template writes, each on a new connection (so that the
    kernel may hand them to either worker)."""
    for i in range(n):
        with httpx.Client(base_url=base, timeout=30.0) as client:
            assert client.get("/readyz").status_code == 200
            r = client.post("/v1/templates", headers={"Authorization": f"Bearer {token}"},
                            json={"template_id": f"procs-{i % 3}", "channel": "SMS",
                                  "body": "Your code is {{ code }}"})
            assert r.status_code in (200, 201), r.text


def test_two_workers_serve_restart_and_stop(stack: Settings, log_dir: Path,
                                            tokens: dict[str, str]) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    token = next(iter(tokens.values()))
    with ProcessGroup() as group:
        proc = group.add(ManagedProcess("api-procs", ["api", "--processes", "2", "--port",
                                                      str(port)], log_dir)).start()
        proc.wait_http(f"{base}/healthz", timeout=120)
        assert proc.proc is not None
        supervisor = psutil.Process(proc.proc.pid)
        wait_for(lambda: len(workers(supervisor)) == 2)
        requests_succeed(base, token)

        first = workers(supervisor)
        victim = first[0]
        victim.kill()
        victim.wait(10)
        wait_for(lambda: len(workers(supervisor)) == 2
                 and victim.pid not in {w.pid for w in workers(supervisor)})
        proc.wait_http(f"{base}/readyz", timeout=120)
        requests_succeed(base, token, n=6)

        pids = [w.pid for w in workers(supervisor)]
        os.kill(supervisor.pid, signal.SIGTERM)  # the supervisor only, not its group
        proc.proc.wait(60)
        wait_for(lambda: not any(alive(pid) for pid in pids), timeout=30)
