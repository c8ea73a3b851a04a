"""How a long-running notiflow process uses the CPU: its priority and Python's collector.

**Priority** (:func:`set_nice`): the CPU is a shared bottleneck too. Priority-lane processes
(the P0 send flow, the priority-lane API) run at a negative niceness when the system allows
it (``CAP_SYS_NICE``, as root or in a container granted it; otherwise they stay at 0 and say
so once), the stack's servers at 0, bulk processes at 10-19: the scheduler then hands P0's
work the cores first, the single-machine equivalent of guaranteed CPU for P0 pods. A tier
with ``realtime`` set (P0 by default, :func:`set_realtime`) goes further: its processes
run in the kernel's round-robin real-time class, so a P0 request never waits for a bulk
process's time slice, and a collection in such a process is not descheduled halfway.

**The collector** (:func:`settle`):

CPython's cyclic collector stops the whole process while it walks the tracked objects of a
generation; a full collection walks them all. Measured with ``notiflow.runtime.gc_pause`` in
``notiflow bench isolation``: full collections of the priority-lane API took up to 777 ms of
wall time under the flood (each stalled every P0 request in the process), and the P3 flow
spent 63 s of 150 s CPU in the collector. Once a process has started (modules, clients,
prepared statements, schemas), those objects live as long as it does, so :func:`settle`
collects once and freezes them (``gc.freeze``: later collections skip them), then raises the
thresholds so the young generation holds a batch's garbage before it is walked.
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger(__name__)

THRESHOLDS = (10_000, 10, 10)
"""``gc.set_threshold``: allocations before a young collection (CPython's default is 700;
50,000 made each young collection a 150-390 ms stall of the API under the flood), young
collections per middle one, middle ones per full one (defaults)."""


def settle(thresholds: tuple[int, int, int] = THRESHOLDS) -> None:
    """Collect, freeze what survived (it lives as long as the process) and set the
    thresholds. Call once the process has started; again after more start-up objects."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    log.info("gc: %d objects frozen, thresholds %s", gc.get_freeze_count(), thresholds)


def to_realtime(tid: int, priority: int) -> None:
    """Move thread ``tid`` (0: this one) to ``SCHED_RR`` at ``priority``; raises
    ``PermissionError`` without ``CAP_SYS_NICE``."""
    os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(priority))


def set_realtime(priority: int) -> bool:
    """Move this thread (and the threads it starts later) to ``SCHED_RR`` at ``priority``
    (1-99); 0 does nothing. Needs ``CAP_SYS_NICE``; without it the thread stays in the normal
    scheduler and says so. The kernel's real-time throttling
    (``kernel.sched_rt_runtime_us``, 95 % of each second by default) keeps a runaway
    real-time process from starving the machine. Returns whether the class is in effect."""
    if priority <= 0:
        return False
    try:
        to_realtime(0, priority)
    except OSError as exc:
        log.warning("cannot run at real-time priority %d (%s); staying in the normal "
                    "scheduler", priority, exc)
        return False
    log.info("scheduling: SCHED_RR priority %d", priority)
    return True


def set_nice(nice: int) -> int:
    """Set this process's niceness (before it starts its threads: they inherit it); a
    negative value needs ``CAP_SYS_NICE``, without it the process keeps its niceness.
    Returns the niceness in effect."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice == current:
        return current
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        log.warning("cannot run at nice %d without CAP_SYS_NICE; staying at %d", nice,
                    current)
        return current
    return nice
