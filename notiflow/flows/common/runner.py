"""Run a dataflow in this process, always with Bytewax recovery.

Offsets and state live in the recovery store (SQLite partitions in ``recovery_dir``); they
are committed at each epoch close, after every sink write of the epoch was confirmed. A
restart with the same directory resumes without loss (output is at-least-once; sends are
deduplicated by lease, status writes are idempotent). A janitor (a thread that runs a short
child process every 30 s) deletes the store's committed tombstones
(``adapters/recovery_store.py``)."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import FrameType

from bytewax.dataflow import Dataflow
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.run import cli_main

from notiflow import telemetry, tuning
from notiflow.adapters.cluster_peers import (
    ClusterSpec,
    dns_resolves,
    settle_size,
    spec_from_hostname,
    watch_size,
)
from notiflow.adapters.recovery_store import start_janitor
from notiflow.adapters.worker import close_all, start_all
from notiflow.settings import Settings

log = logging.getLogger("notiflow.flows.runner")


def ensure_recovery_dir(path: Path, partitions: int) -> None:
    """Create the recovery partitions once; an existing store is reused as is. The
    processes of one cluster starting together on a host share the directory: a lock file
    beside it lets exactly one of them create the partitions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists() and any(path.glob("part-*.sqlite3")):
            return
        path.mkdir(parents=True, exist_ok=True)
        init_db_dir(path, partitions)


@dataclass(frozen=True)
class Membership:
    """This process's place in its Bytewax cluster: ``-i`` and ``-a`` as given, or found in
    DNS (``spec`` set: a StatefulSet member, whose size a watcher follows)."""

    process_id: int | None = None
    addresses: str | None = None
    spec: ClusterSpec | None = None

    @property
    def workers(self) -> int:
        return len(self.addresses.split(";")) if self.addresses else 1


def membership(settings: Settings, process_id: int | None, addresses: str | None,
               peers_dns: str | None, peer_port: int) -> Membership:
    """``-i``/``-a`` as given, or, with ``peers_dns`` (the StatefulSet's headless service
    domain), this pod's ordinal and every member that resolves once their count has held
    (``adapters/cluster_peers.py``). At most ``recovery_partitions`` members."""
    if peers_dns is None:
        return Membership(process_id, addresses)
    if process_id is not None or addresses:
        raise ValueError("--peers-dns replaces -i/--process-id and -a/--addresses")
    spec = spec_from_hostname(socket.gethostname(), peers_dns, peer_port,
                              settings.recovery_partitions)
    size = settle_size(spec, dns_resolves, settle=settings.cluster_settle_seconds,
                       interval=settings.cluster_watch_seconds)
    log.info("cluster %s: member %d of %d", spec.set_name, spec.ordinal, size)
    return Membership(spec.ordinal, ";".join(spec.addresses(size)), spec)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_flow(build: Callable[[], Dataflow], settings: Settings, name: str, *,
             process_id: int | None = None, addresses: str | None = None,
             members: Membership | None = None, recovery_dir: Path | None = None,
             nice: int = 0, realtime: int = 0,
             epoch: timedelta | None = None) -> None:
    """Build and run a flow until it is stopped (SIGTERM/SIGINT) or fails. ``nice`` lowers
    this process's CPU priority (lower tiers yield the CPU to higher ones); ``realtime``
    above 0 moves it to the real-time class (:func:`notiflow.tuning.set_realtime`). Logging and
    telemetry are set up first (``service.name`` ``notiflow-<name>``, e.g.
    ``notiflow-send-p0``). ``epoch``: the Bytewax epoch (default ``flow_epoch_seconds``).
    ``members`` (from :func:`membership`) replaces ``process_id`` and ``addresses``; found in
    DNS, the process stops itself when its cluster is rescaled, to be started again with the
    new list."""
    if members is not None:
        process_id, addresses = members.process_id, members.addresses
    tier = name.removeprefix("send-").upper() if name.startswith("send-p") else None
    telemetry.setup(settings, name, tier=tier, worker=process_id or 0)
    tuning.set_nice(nice)
    tuning.set_realtime(realtime)
    rdir = (recovery_dir or settings.stack_dir / "recovery" / name).resolve()
    ensure_recovery_dir(rdir, settings.recovery_partitions)
    flow = build()
    start_all()
    tuning.settle()
    janitor = start_janitor(rdir)
    if members is not None and members.spec is not None:
        watch_size(members.spec, members.workers, dns_resolves,
                   interval=settings.cluster_watch_seconds, stop=janitor)
    signal.signal(signal.SIGTERM, _terminate)
    os.environ.setdefault("RUST_BACKTRACE", "0")
    epoch = epoch or timedelta(seconds=settings.flow_epoch_seconds)
    log.info("starting %s (recovery %s, epoch %ss)", name, rdir, epoch.total_seconds())
    try:
        cli_main(
            flow,
            workers_per_process=1,
            process_id=process_id,
            addresses=addresses.split(";") if addresses else None,
            epoch_interval=epoch,
            recovery_config=RecoveryConfig(rdir),
        )
    except KeyboardInterrupt:
        log.info("%s stopped", name)
    except Exception as exc:
        if not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        log.info("%s stopped (interrupted mid-batch; resumes from the last epoch)", name)
    finally:
        janitor.set()
        close_all()


Serve = Callable[["Settings", str, "asyncio.Event"], Awaitable[None]]


def run_until_signalled(settings: Settings, kind: str, owner: str, serve: Serve) -> None:
    """Run a plain asyncio process (scheduler, expander) as ``owner`` until SIGTERM or SIGINT
    sets its stop event; ``serve`` then releases what it holds for another process."""
    telemetry.setup(settings, kind)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("starting %s %s", kind, owner)
        await serve(settings, owner, stop)
        log.info("%s %s stopped", kind, owner)

    asyncio.run(run())
