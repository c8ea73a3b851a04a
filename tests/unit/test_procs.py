"""A ``ManagedProcess`` child dies with its owner, also one started off the main thread; a
stack server does not (it outlives ``notiflow stack up``). Linux only: the parent-death
signal is a Linux ``prctl``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from notiflow.ops.procs import PARENT_DEATH_SIGNAL, ManagedProcess, ProcessGroup
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import ctypes, os, signal, sys, time
from pathlib import Path

marker = Path(sys.argv[1])


def write(suffix, text):
    tmp = marker.with_suffix(suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, marker.with_suffix(suffix))


def on_term(signum, frame):
    write(".term", "after" if (marker.parent / "killing").exists() else "before")
    os._exit(0)


signal.signal(signal.SIGTERM, on_term)
deathsig = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(deathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
write(".ready", str(deathsig.value))
while True:
    time.sleep(1)
"""
"""A child that notes its parent-death signal when ready and, on SIGTERM, whether the test had
begun to kill its owner (``killing`` written)."""

PARENT = """
import json, os, sys, threading, time
from pathlib import Path

from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess
from notiflow.ops.stack import Stack
from notiflow.ops.stack.base import Component
from notiflow.settings import Settings

tmp = Path(sys.argv[1])
child = sys.argv[2]


def argv(name):
    return [sys.executable, "-c", child, str(tmp / name)]


def ready(name):
    deadline = time.monotonic() + 30
    while not (tmp / f"{name}.ready").exists():
        assert time.monotonic() < deadline, f"{name} not ready"
        time.sleep(0.05)


main = ManagedProcess("main", [], tmp / "logs", argv=argv("main")).start()
started = {}


def from_a_thread():
    started["tid"] = threading.get_native_id()
    started["proc"] = ManagedProcess("thread", [], tmp / "logs", argv=argv("thread")).start()
    ready("thread")


thread = threading.Thread(target=from_a_thread)
thread.start()
thread.join()
task = Path(f"/proc/self/task/{started['tid']}")
while task.exists():
    time.sleep(0.01)

stack = Stack(Settings(stack_dir=tmp / "stack"), log=lambda _line: None, object_store=False)
stack.p.make()
server = Component("server", free_port(), (), lambda: argv("server"), lambda: True)
stack._start(server)
for name in ("main", "server"):
    ready(name)
pids = {"parent": os.getpid(), "main": main.proc.pid, "thread": started["proc"].proc.pid,
        "server": stack.pid(server)}
(tmp / "pids.tmp").write_text(json.dumps(pids))
os.replace(tmp / "pids.tmp", tmp / "pids.json")
time.sleep(300)
"""
"""Starts a child on its main thread, one from a thread that has ended by the time it
reports, and a stack server; writes their pids, then waits to be killed."""


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, not yet reaped by its new parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_children_die_with_a_killed_owner_and_stack_servers_do_not(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), CHILD], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pids: dict[str, int] = {}

    def reported() -> str | None:
        if parent.poll() is not None:
            assert parent.stderr is not None
            pytest.fail(f"the parent exited:\n{parent.stderr.read().decode()}")
        path = tmp_path / "pids.json"
        return path.read_text() if path.exists() else None

    try:
        pids = json.loads(wait_for(reported, timeout=60, interval=0.05,
                                   what="the parent's children"))
        deathsig = {name: int((tmp_path / f"{name}.ready").read_text())
                    for name in ("main", "thread", "server")}
        assert deathsig == {"main": PARENT_DEATH_SIGNAL, "thread": PARENT_DEATH_SIGNAL,
                            "server": 0}

        (tmp_path / "killing").touch()
        os.kill(pids["parent"], signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: gone(pids["main"]) and gone(pids["thread"]), timeout=30,
                 interval=0.05, what="the children of the killed parent to exit")
        assert {name: (tmp_path / f"{name}.term").read_text() for name in ("main", "thread")
                } == {"main": "after", "thread": "after"}, "stopped while the owner still ran"
        assert not gone(pids["server"])
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.wait(10)
        for pid in pids.values():
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        assert parent.stderr is not None
        parent.stderr.close()


PEER = """
import os, signal, sys, time
from pathlib import Path

me, peer = Path(sys.argv[1]), Path(sys.argv[2])


def on_term(signum, frame):
    me.touch()
    while not peer.exists():
        time.sleep(0.01)
    os._exit(0)


signal.signal(signal.SIGTERM, on_term)
me.with_suffix(".ready").touch()
while True:
    time.sleep(1)
"""
"""A child that, on SIGTERM, exits only once its peer was signalled too, as each process of
a Bytewax cluster does."""


def test_a_group_stops_a_cluster_whose_processes_stop_only_together(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    group = ProcessGroup()
    procs = [group.add(ManagedProcess(me.name, [], tmp_path / "logs",
                                      argv=[sys.executable, "-c", PEER, str(me), str(peer)]))
             for me, peer in ((a, b), (b, a))]
    try:
        for p in procs:
            p.start()
        wait_for(lambda: a.with_suffix(".ready").exists() and b.with_suffix(".ready").exists(),
                 timeout=30, interval=0.05, what="both children ready")
        group.stop_all(timeout=10)
        assert [p.proc.returncode for p in procs if p.proc] == [0, 0], "one was SIGKILLed"
    finally:
        for p in procs:
            p.kill()
