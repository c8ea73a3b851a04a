"""CPU time and memory of a benchmark's processes, and the machine's pressure counters.

A :class:`Sampler` samples on threads of its own (never the event loop of the load it
measures): every watched process and the machine (:mod:`notiflow.bench.host`) every
``interval`` seconds, one sample when it starts and one when it stops, so every measured
window has samples at both ends. Figures between two instants come from the samples nearest
to them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict, TypeVar

import psutil

from notiflow.bench import host
from notiflow.bench.jvm import compiler_cpu_s
from notiflow.bench.proc_cpu import tree_cpu_s


class ProcessFigures(TypedDict):
    """One process's row of :meth:`Sampler.table` (CPU seconds, RSS MiB)."""

    cpu_s: float
    rss_start_mb: float
    rss_mid_mb: float
    rss_end_mb: float
    rss_max_mb: float
    rss_tenths_mb: list[float]


@dataclass
class ProcSample:
    at: float
    cpu_s: float
    rss_mb: float
    jit_s: float
    """CPU seconds of a JVM's JIT compiler threads (part of ``cpu_s``; 0 for other
    processes)."""


@dataclass
class Sampler:
    """Samples CPU time and RSS of named processes, and the machine's pressure counters
    (:mod:`notiflow.bench.host`), every ``interval`` seconds (a thread); every
    ``io_interval`` seconds in which the machine's I/O pressure grew, the watched processes'
    threads waiting in uninterruptible sleep (a second thread)."""

    interval: float = 1.0
    io_interval: float = 0.1
    samples: dict[str, list[ProcSample]] = field(default_factory=dict)
    host_samples: list[host.HostSample] = field(default_factory=list)
    blocked: list[host.Blocked] = field(default_factory=list)
    _procs: dict[str, psutil.Process] = field(default_factory=dict)
    _jvms: set[str] = field(default_factory=set)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _io_thread: threading.Thread | None = None

    def watch(self, name: str, pid: int, *, jvm: bool = False) -> None:
        """Sample process ``pid`` as ``name``; ``jvm``: its JIT compiler's CPU too."""
        self._procs[name] = psutil.Process(pid)
        self.samples.setdefault(name, [])
        if jvm:
            self._jvms.add(name)

    def start(self) -> Sampler:
        """Take a first sample now (a phase shorter than ``interval`` still has two), then
        sample every ``interval`` seconds until :meth:`stop`."""
        self.sample()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()
        self._io_thread = threading.Thread(target=self._watch_io, name="bench-io-sampler",
                                           daemon=True)
        self._io_thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._io_thread):
            if thread is not None:
                thread.join(timeout=5)
        self.sample()

    def sample(self) -> None:
        """CPU of each watched process with its unwatched descendants (``tree_cpu_s``: an
        API of several worker processes); memory of the process alone."""
        now = time.time()
        procs = list(self._procs.items())
        skip = {proc.pid for _name, proc in procs}
        for name, proc in procs:
            try:
                with proc.oneshot():
                    cpu = tree_cpu_s(proc, skip)
                    rss = proc.memory_info().rss
            except psutil.Error:
                continue
            jit = compiler_cpu_s(proc.pid) if name in self._jvms else None
            self.samples[name].append(ProcSample(now, cpu, rss / 2**20,
                                                 jit or 0.0))
        machine = host.read(time.time())
        if machine is not None:
            self.host_samples.append(machine)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def _watch_io(self) -> None:
        watch = host.IoWatch()
        while not self._stop.wait(self.io_interval):
            if watch.pressed():
                pids = {name: p.pid for name, p in list(self._procs.items())}
                self.blocked.extend(host.blocked_threads(pids, time.time()))

    def _nearest(self, name: str, t0: float, t1: float) -> tuple[ProcSample, ProcSample] | None:
        """``name``'s samples nearest to two instants (None when it has none)."""
        return _nearest(self.samples.get(name, []), t0, t1)

    def cpu_between(self, name: str, t0: float, t1: float) -> float:
        """CPU seconds ``name`` used between two instants (nearest samples)."""
        ends = self._nearest(name, t0, t1)
        return max(0.0, ends[1].cpu_s - ends[0].cpu_s) if ends else 0.0

    def jit_between(self, name: str, t0: float, t1: float) -> float:
        """CPU seconds ``name``'s JIT compiler used between two instants (nearest samples;
        0 for a process not watched as a JVM)."""
        ends = self._nearest(name, t0, t1)
        return max(0.0, ends[1].jit_s - ends[0].jit_s) if ends else 0.0

    def machine_between(self, t0: float, t1: float) -> tuple[float, float] | None:
        """(busy, idle) CPU seconds of the whole machine between two instants: the nearest
        host samples, or for a window shorter than the sampling interval the samples around
        it; None without two samples that count CPU, or for an empty window."""
        s = [x for x in self.host_samples if x.cpu_busy_s or x.cpu_idle_s]
        ends = _nearest(s, t0, t1) if len(s) >= 2 and t1 > t0 else None
        if ends is None:
            return None
        a, b = ends
        if b.at <= a.at:
            a = max((x for x in s if x.at <= t0), key=lambda x: x.at, default=s[0])
            b = min((x for x in s if x.at >= t1), key=lambda x: x.at, default=s[-1])
        if b.at <= a.at:
            return None
        return b.cpu_busy_s - a.cpu_busy_s, b.cpu_idle_s - a.cpu_idle_s

    def jvms(self) -> list[str]:
        """The names watched as JVMs."""
        return sorted(self._jvms)

    def rss_at(self, name: str, t: float) -> float:
        """RSS in MiB of the sample nearest to ``t``."""
        s = self.samples.get(name, [])
        return min(s, key=lambda x: abs(x.at - t)).rss_mb if s else 0.0

    def table(self, t0: float, t1: float) -> dict[str, ProcessFigures]:
        """Per process: CPU seconds between ``t0`` and ``t1``, RSS (MiB) at both instants, at
        the middle and at every tenth of the interval, and the highest RSS sampled."""
        out: dict[str, ProcessFigures] = {}
        for name in self.samples:
            out[name] = {"cpu_s": round(self.cpu_between(name, t0, t1), 2),
                         "rss_start_mb": round(self.rss_at(name, t0), 1),
                         "rss_mid_mb": round(self.rss_at(name, (t0 + t1) / 2), 1),
                         "rss_end_mb": round(self.rss_at(name, t1), 1),
                         "rss_max_mb": round(self.rss(name)[2], 1),
                         "rss_tenths_mb": [round(self.rss_at(name, t0 + (t1 - t0) * i / 10), 1)
                                           for i in range(11)]}
        return out

    def cpu_timeline(self, t0: float, t1: float) -> dict[str, list[tuple[float, float]]]:
        """Per process: (seconds after ``t0``, share of one core used since the previous
        sample) of every sample between ``t0`` and ``t1``: what ran when a stage stalled."""
        out: dict[str, list[tuple[float, float]]] = {}
        for name, s in self.samples.items():
            pts = [(round(b.at - t0, 1), round((b.cpu_s - a.cpu_s) / (b.at - a.at), 2))
                   for a, b in itertools.pairwise(s) if t0 <= b.at <= t1 and b.at > a.at]
            out[name] = pts
        return out

    def rss(self, name: str) -> tuple[float, float, float]:
        """(first, last, max) RSS in MiB."""
        s = self.samples.get(name, [])
        if not s:
            return (0.0, 0.0, 0.0)
        return (s[0].rss_mb, s[-1].rss_mb, max(x.rss_mb for x in s))


S = TypeVar("S", ProcSample, host.HostSample)


def _nearest(samples: Sequence[S], t0: float, t1: float) -> tuple[S, S] | None:
    """The samples nearest to two instants (None when there are none)."""
    if not samples:
        return None
    return (min(samples, key=lambda x: abs(x.at - t0)),
            min(samples, key=lambda x: abs(x.at - t1)))
