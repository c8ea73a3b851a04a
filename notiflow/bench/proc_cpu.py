"""CPU seconds of the processes a benchmark watches, their children included, and the wait
for the stack to be quiet again after a saturating load."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import psutil

QUIET_MARGIN = 0.15
"""Share of a core above its share at rest that :func:`wait_quiet` still counts as quiet."""
QUIET = ("cassandra", "kafka")
"""The processes :func:`wait_quiet` waits for: what a saturating load leaves busy (compaction,
log segments) after it ends."""


def tree_cpu_s(proc: psutil.Process, skip: Collection[int] = ()) -> float:
    """CPU seconds (user + system) of ``proc`` and its live descendants: ``notiflow api
    --processes N`` serves from N worker children (and multiprocessing's resource tracker).
    Descendants whose pid is in ``skip`` (processes watched on their own) are left out with
    theirs, and so are the children of this very process (the generator starts the processes
    it measures). A child that exits between two readings drops out of the later one: its
    CPU since the earlier reading is lost, so that interval reads low (a worker replaced
    mid-step). Raises ``psutil.Error`` when ``proc`` itself is gone."""
    t = proc.cpu_times()
    total = t.user + t.system
    if proc.pid == os.getpid():
        return total
    stack = list(proc.children())
    while stack:
        child = stack.pop()
        if child.pid in skip:
            continue
        try:
            c = child.cpu_times()
            stack.extend(child.children())
        except psutil.Error:
            continue
        total += c.user + c.system
    return total


def cpu_now(procs: Mapping[str, psutil.Process]) -> dict[str, float]:
    """CPU seconds of each process so far (:func:`tree_cpu_s`, each watched process's
    subtree without the others'); gone processes are left out."""
    skip = {p.pid for p in procs.values()}
    out: dict[str, float] = {}
    for name, proc in procs.items():
        try:
            out[name] = tree_cpu_s(proc, skip)
        except psutil.Error:
            continue
    return out


def at_rest(procs: Mapping[str, psutil.Process], seconds: float) -> dict[str, float]:
    """Share of one core each process uses over ``seconds`` of no load."""
    before = cpu_now(procs)
    time.sleep(seconds)
    after = cpu_now(procs)
    return {name: round((after[name] - cpu) / seconds, 3) for name, cpu in before.items()
            if name in after}


def wait_quiet(sample: Callable[[], Mapping[str, float]], rest: Mapping[str, float], *,
               names: Iterable[str] = QUIET, margin: float = QUIET_MARGIN, timeout_s: float = 90.0,
               interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep,
               busy: Callable[[], list[str]] = list) -> dict[str, Any]:
    """Sample CPU seconds (``sample``, e.g. :func:`cpu_now` of the watched processes) every
    ``interval_s`` until each of ``names`` used at most its share at rest (``rest``; 0 when
    not measured) plus ``margin`` of a core over the last interval and ``busy`` (background
    work still under way, e.g. :func:`~notiflow.bench.cassandra_quiet.background`) names
    nothing, or ``timeout_s`` passed. Names ``sample`` does not report are not waited for.
    Returns the seconds waited, whether it timed out, the last interval's shares and what
    was still busy."""
    names = list(names)
    start = clock()
    before, t0 = sample(), start
    shares: dict[str, float] = {}
    while True:
        sleep(interval_s)
        after, t1 = sample(), clock()
        dt = max(t1 - t0, 1e-9)
        shares = {n: round((after[n] - before[n]) / dt, 3) for n in names
                  if n in after and n in before}
        before, t0 = after, t1
        waited = round(t1 - start, 1)
        calm = all(v <= rest.get(n, 0.0) + margin for n, v in shares.items())
        running = busy() if calm else []
        if calm and not running:
            return {"waited_s": waited, "timed_out": False, "cpu": shares, "busy": []}
        if t1 - start >= timeout_s:
            return {"waited_s": waited, "timed_out": True, "cpu": shares, "busy": running}
