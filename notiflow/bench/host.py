"""What the whole machine was doing while a benchmark ran: pressure stall information
(``/proc/pressure``: how long tasks waited for a core, for I/O, for memory), dirty and
under-writeback page cache (``/proc/vmstat``), the disks' reads and writes (``/proc/diskstats``)
and, whenever the machine's I/O pressure rises, which threads of the watched processes wait
in uninterruptible sleep and in which kernel function (``/proc/<pid>/task/*/stat``, ``wchan``).

A P0 stall in which every store is slow at once and no JVM paused is the machine's; these
samples say whether it waited on I/O (page-cache writeback, fsyncs) or on the cores, and which
process was held.
"""

from __future__ import annotations

import collections
import itertools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PAGE_BYTES = 4096
SECTOR_BYTES = 512
_PSI = re.compile(r"^(some|full) .*total=(\d+)$")
_POOL_SUFFIX = re.compile(r"[-_:#]?\d+$")
_WHOLE_DISK = re.compile(r"^(vd|sd|xvd|hd)[a-z]+$|^nvme\d+n\d+$|^mmcblk\d+$")


@dataclass(frozen=True)
class HostSample:
    """Cumulative counters at one instant (``at``, epoch seconds); microseconds for pressure."""

    at: float
    cpu_some_us: int
    io_some_us: int
    io_full_us: int
    memory_some_us: int
    dirty_pages: int
    writeback_pages: int
    written_sectors: int
    write_ms: int
    read_sectors: int
    read_ms: int
    cpu_busy_s: float = 0.0
    """CPU seconds the machine's cores spent busy (``/proc/stat``: every state but idle
    and iowait), all processes and the kernel."""
    cpu_idle_s: float = 0.0


def _cpu(path: Path) -> tuple[float, float]:
    """(busy, idle) CPU seconds of all cores since boot (guest time is already in user);
    zeros where there is no such file."""
    if not path.exists():
        return 0.0, 0.0
    f = [int(x) for x in path.read_text().split("\n", 1)[0].split()[1:]]
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    busy = sum(f[:8]) - idle
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, idle / hz


def _psi(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        m = _PSI.match(line.strip())
        if m:
            out[m[1]] = int(m[2])
    return out


def _vmstat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in ("nr_dirty", "nr_writeback"):
            out[key] = int(value)
    return out


def _disks(path: Path) -> tuple[int, int, int, int]:
    """(sectors written, ms spent writing, sectors read, ms spent reading) summed over whole
    disks (not partitions)."""
    written = write_ms = read = read_ms = 0
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) >= 11 and _WHOLE_DISK.match(f[2]):
            read += int(f[5])
            read_ms += int(f[6])
            written += int(f[9])
            write_ms += int(f[10])
    return written, write_ms, read, read_ms


def read(at: float, proc: Path = Path("/proc")) -> HostSample | None:
    """The counters now, or None where the kernel has no pressure accounting."""
    try:
        cpu, io, memory = (_psi(proc / "pressure" / k) for k in ("cpu", "io", "memory"))
        vm = _vmstat(proc / "vmstat")
        written, write_ms, read_sectors, read_ms = _disks(proc / "diskstats")
        busy, idle = _cpu(proc / "stat")
    except (OSError, ValueError, IndexError):
        return None
    return HostSample(at, cpu.get("some", 0), io.get("some", 0), io.get("full", 0),
                      memory.get("some", 0), vm.get("nr_dirty", 0), vm.get("nr_writeback", 0),
                      written, write_ms, read_sectors, read_ms, busy, idle)


def timeline(samples: list[HostSample], t0: float, t1: float) -> list[dict[str, float]]:
    """Per interval between consecutive samples inside [t0, t1]: seconds after ``t0`` and, per
    second of the interval, ms of pressure (cpu/io/memory ``some``, io ``full``), MB written
    to and read from disk and ms the disks spent writing and reading; dirty and writeback MB
    at the interval's end."""
    out = []
    for a, b in itertools.pairwise(samples):
        if not (t0 <= b.at <= t1) or b.at <= a.at:
            continue
        per_s = 1.0 / (b.at - a.at)
        out.append({
            "t": round(b.at - t0, 1),
            "cpu_some_ms": round((b.cpu_some_us - a.cpu_some_us) / 1000 * per_s, 1),
            "io_some_ms": round((b.io_some_us - a.io_some_us) / 1000 * per_s, 1),
            "io_full_ms": round((b.io_full_us - a.io_full_us) / 1000 * per_s, 1),
            "memory_some_ms": round((b.memory_some_us - a.memory_some_us) / 1000 * per_s, 1),
            "write_mb": round((b.written_sectors - a.written_sectors) * SECTOR_BYTES / 2**20
                              * per_s, 2),
            "write_busy_ms": round((b.write_ms - a.write_ms) * per_s, 1),
            "read_mb": round((b.read_sectors - a.read_sectors) * SECTOR_BYTES / 2**20 * per_s, 2),
            "read_busy_ms": round((b.read_ms - a.read_ms) * per_s, 1),
            "dirty_mb": round(b.dirty_pages * PAGE_BYTES / 2**20, 1),
            "writeback_mb": round(b.writeback_pages * PAGE_BYTES / 2**20, 1),
        })
    return out


def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Totals and worst seconds of a :func:`timeline`."""
    if not rows:
        return {"samples": 0}

    def worst(key: str) -> list[float]:
        top = max(rows, key=lambda r: r[key])
        return [top["t"], top[key]]

    return {"samples": len(rows),
            "io_some_s": round(sum(r["io_some_ms"] for r in rows) / 1000, 1),
            "io_full_s": round(sum(r["io_full_ms"] for r in rows) / 1000, 1),
            "cpu_some_s": round(sum(r["cpu_some_ms"] for r in rows) / 1000, 1),
            "written_mb": round(sum(r["write_mb"] for r in rows), 1),
            "read_mb": round(sum(r.get("read_mb", 0.0) for r in rows), 1),
            "worst_io_full": worst("io_full_ms"), "worst_io_some": worst("io_some_ms"),
            "worst_cpu_some": worst("cpu_some_ms"), "max_dirty_mb": worst("dirty_mb"),
            "max_writeback_mb": worst("writeback_mb")}


def at_stalls(rows: list[dict[str, float]], stalls: list[tuple[float, str, float]],
              interval_s: float, blocked: list[tuple[float, str]] | None = None
              ) -> list[dict[str, Any]]:
    """Per second in which a P0 stage's export interval (``interval_s``, ending then) held a
    stall: the host row of that interval with the most pressure and, from ``blocked``
    (:func:`blocked_timeline`), the threads found waiting in that interval, most often first."""
    out: list[dict[str, Any]] = []
    for t, group in itertools.groupby(sorted(stalls), key=lambda s: round(s[0])):
        lo, hi = t - interval_s - 0.5, t + 0.5
        near = [r for r in rows if lo <= r["t"] <= hi]
        if not near:
            continue
        row = max(near, key=lambda r: r["io_some_ms"] + r["cpu_some_ms"])
        held = collections.Counter(who for at, who in blocked or [] if lo <= at <= hi)
        out.append({**row, "host_t": row["t"], "t": t,
                    "stages": sorted({s for _, s, _ in group}),
                    "blocked": [[who, n] for who, n in held.most_common(6)]})
    return out


@dataclass(frozen=True)
class Blocked:
    """A thread of a watched process in uninterruptible sleep (state ``D``: waiting on I/O,
    mostly) at ``at``; ``wchan``: the kernel function it waits in."""

    at: float
    process: str
    thread: str
    wchan: str


def threads(pid: int, proc: Path = Path("/proc")) -> list[tuple[str, str, list[str]]] | None:
    """Every thread of process ``pid``: its id, its name and the fields of its ``stat`` after
    the name (the state first; utime and stime at 11 and 12); None when the process is
    gone."""
    tasks = proc / str(pid) / "task"
    try:
        tids = os.listdir(tasks)
    except OSError:
        return None
    out = []
    for tid in tids:
        try:
            stat = (tasks / tid / "stat").read_text()
        except OSError:
            continue
        close = stat.rfind(")")
        out.append((tid, stat[stat.find("(") + 1:close], stat[close + 2:].split()))
    return out


def blocked_threads(pids: Mapping[str, int], at: float,
                    proc: Path = Path("/proc")) -> list[Blocked]:
    """The threads of the named processes in state ``D`` now (gone processes are skipped)."""
    out: list[Blocked] = []
    for name, pid in pids.items():
        for tid, thread, fields in threads(pid, proc) or []:
            if fields[:1] != ["D"]:
                continue
            try:
                wchan = (proc / str(pid) / "task" / tid / "wchan").read_text().strip() or "?"
            except OSError:
                wchan = "?"
            out.append(Blocked(at, name, thread, wchan))
    return out


def blocked_timeline(blocked: list[Blocked], t0: float, t1: float) -> list[tuple[float, str]]:
    """(seconds after ``t0``, ``process/thread wchan``) of every blocked thread seen inside
    [t0, t1]; thread names lose their trailing numbers, so a pool's threads count as one."""
    return [(round(b.at - t0, 1), f"{b.process}/{_POOL_SUFFIX.sub('', b.thread)} {b.wchan}")
            for b in blocked if t0 <= b.at <= t1]


def blocked_summary(held: list[tuple[float, str]], top: int = 12) -> list[list[Any]]:
    """The most often seen of a :func:`blocked_timeline`: ``[who, scans seen, first t, last t]``."""
    seen: dict[str, list[Any]] = {}
    for at, who in held:
        row = seen.setdefault(who, [who, 0, at, at])
        row[1] += 1
        row[3] = at
    return sorted(seen.values(), key=lambda r: -r[1])[:top]


class IoWatch:
    """Tells when the machine's I/O pressure (tasks waiting on I/O, ``some``) grew by at least
    ``threshold_us`` since the previous call: the trigger of a thread scan, which would cost a
    few percent of a core if it ran every tenth of a second for the whole run."""

    def __init__(self, threshold_us: int = 10_000, proc: Path = Path("/proc")) -> None:
        self._file = proc / "pressure" / "io"
        self._threshold = threshold_us
        self._last: int | None = None

    def pressed(self) -> bool:
        try:
            now = _psi(self._file).get("some", 0)
        except (OSError, ValueError):
            return False
        grew = self._last is not None and now - self._last >= self._threshold
        self._last = now
        return grew
