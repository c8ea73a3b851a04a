"""Child processes of notiflow (API, fakes, flows) for the demo and the test suite, and how a
plain asyncio server process runs until it is told to stop (:func:`serve_until_signalled`).

Each child writes to its own log file (never to the parent's stdout), runs in its own process
group, and is stopped when the owner exits; on Linux it also gets :data:`PARENT_DEATH_SIGNAL`
when the owner dies without stopping it (SIGKILL, a crash), so no child outlives a killed test
session or demo. The stack's servers are not started here: they outlive the command that
started them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")

PARENT_DEATH_SIGNAL = signal.SIGTERM
"""What a child gets when its owner dies: the stop every notiflow process shuts down on, so a
child with processes of its own (the API's workers) stops them too."""
_PR_SET_PDEATHSIG = 1

_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="notiflow-spawn")
"""Starts the children asked for off the main thread: Linux sends the parent-death signal
when the *thread* that forked a child ends, so every child is forked by a thread that lasts
as long as this process (the main thread, or this executor's one worker)."""


class ProcessFailed(RuntimeError):
    pass


def dies_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child receive :data:`PARENT_DEATH_SIGNAL` when this
    process dies, and exit at once if it died before the child could ask; None off Linux.
    The child must be forked by a thread that lives as long as this process
    (:func:`on_lasting_thread`)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent, sig = os.getpid(), int(PARENT_DEATH_SIGNAL)

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def on_lasting_thread(start: Callable[[], T]) -> T:
    """``start()`` on the main thread, or on the spawner thread when called from another
    (which may end before the child it would fork)."""
    if threading.current_thread() is threading.main_thread():
        return start()
    return _spawner.submit(start).result()


def serve_until_signalled(run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``run(stop)`` on a uvloop loop; SIGTERM or SIGINT sets ``stop``, and this returns
    once ``run`` has shut down cleanly."""
    import uvloop

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(stop)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


class ManagedProcess:
    """One ``notiflow ...`` child process."""

    def __init__(self, name: str, args: list[str], log_dir: Path,
                 env: Mapping[str, str] | None = None, *,
                 argv: list[str] | None = None) -> None:
        """``argv``: run this command line instead of ``notiflow`` with ``args``."""
        self.name = name
        self.args = args
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self.env = dict(env if env is not None else os.environ)
        self.proc: subprocess.Popen[bytes] | None = None
        log_dir.mkdir(parents=True, exist_ok=True)

    @property
    def command(self) -> list[str]:
        return self.argv or [sys.executable, "-m", "notiflow.cli", *self.args]

    def start(self) -> ManagedProcess:
        """Start the child in a session of its own, tied to this process's life
        (:func:`dies_with_parent`)."""
        def spawn() -> subprocess.Popen[bytes]:
            with open(self.log_path, "ab") as log, open(os.devnull, "rb") as devnull:
                return subprocess.Popen(self.command, stdin=devnull, stdout=log,
                                        stderr=subprocess.STDOUT, env=self.env,
                                        start_new_session=True,
                                        preexec_fn=dies_with_parent())

        self.proc = on_lasting_thread(spawn)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60.0) -> ManagedProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise ProcessFailed(f"{self.name} exited ({self.proc and self.proc.returncode});"
                                    f" log:\n{self.tail()}")
            try:
                if ready():
                    return self
            except Exception:
                pass
            time.sleep(0.2)
        raise ProcessFailed(f"{self.name} not ready after {timeout:.0f}s; log:\n{self.tail()}")

    def wait_http(self, url: str, timeout: float = 60.0) -> ManagedProcess:
        return self.wait_until(lambda: httpx.get(url, timeout=1.0).status_code == 200, timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful), SIGKILL after ``timeout``."""
        self._signal(signal.SIGTERM)
        self._wait(timeout)

    def kill(self) -> None:
        """SIGKILL: a crash, for recovery tests."""
        self._signal(signal.SIGKILL)
        self._wait(10)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def _wait(self, timeout: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)


def stop_together(procs: Sequence[ManagedProcess], timeout: float = 20.0) -> None:
    """SIGTERM every process at once (graceful), SIGKILL those still running ``timeout``
    seconds later. At once, because the processes of one Bytewax cluster stop only
    together: one signalled alone waits for its peers until it is killed."""
    for p in procs:
        p._signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        p._wait(max(0.0, deadline - time.monotonic()))


class ProcessGroup:
    """Start several children; stop them all together on exit."""

    def __init__(self) -> None:
        self.procs: list[ManagedProcess] = []

    def add(self, proc: ManagedProcess) -> ManagedProcess:
        self.procs.append(proc)
        return proc

    def stop_all(self, timeout: float = 20.0) -> None:
        """:func:`stop_together` every child, the last started first."""
        stop_together(list(reversed(self.procs)), timeout)

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
