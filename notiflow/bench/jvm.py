"""The stack's JVMs (Kafka, Cassandra) during a benchmark: their stop-the-world pauses, from
their safepoint logs (``ops/stack/jvm.py`` ``gc_log``; a P0 stall that lines up with a pause of the
JVM it waited on is that JVM's), and the CPU of their JIT compilers."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from notiflow.bench.host import threads

_LINE = re.compile(r"^\[(?P<at>[^\]]+)\].*Safepoint \"(?P<what>[^\"]+)\".*Total: (?P<ns>\d+) ns")


def pauses(log: Path, t0: float, t1: float) -> list[tuple[float, float, str]]:
    """(seconds after ``t0``, pause ms, operation) of every safepoint between ``t0`` and
    ``t1`` (epoch seconds) in ``log`` and its rotated predecessors."""
    out: list[tuple[float, float, str]] = []
    for path in sorted(log.parent.glob(f"{log.name}*")):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            m = _LINE.match(line)
            if not m:
                continue
            try:
                at = datetime.strptime(m["at"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
            except ValueError:
                continue
            if t0 <= at <= t1:
                out.append((round(at - t0, 2), int(m["ns"]) / 1e6, m["what"]))
    return sorted(out)


def summary(log: Path, t0: float, t1: float, above_ms: float = 50.0) -> dict[str, Any]:
    """Count, total and longest pause, and the pauses longer than ``above_ms``."""
    got = pauses(log, t0, t1)
    return {"pauses": len(got), "total_ms": round(sum(ms for _, ms, _ in got), 1),
            "max_ms": round(max((ms for _, ms, _ in got), default=0.0), 1),
            "long": [(t, round(ms, 1), what) for t, ms, what in got if ms > above_ms]}


COMPILER_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
"""HotSpot's JIT compiler threads as the kernel names them (15 characters: ``C2 CompilerThread0``
is ``C2 CompilerThre``)."""


def compiler_cpu_s(pid: int, proc: Path = Path("/proc")) -> float | None:
    """CPU seconds the JIT compiler threads of JVM ``pid`` have used so far (None when the
    process is gone). A JVM compiles the code paths a workload makes hot for minutes after it
    starts; on two cores that CPU is taken from whatever phase of a benchmark is running."""
    found = threads(pid, proc)
    if found is None:
        return None
    ticks = sum(int(f[11]) + int(f[12]) for _, name, f in found
                if name.startswith(COMPILER_THREADS))
    return ticks / os.sysconf("SC_CLK_TCK")
