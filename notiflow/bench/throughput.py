"""``notiflow bench throughput`` and ``notiflow bench scale``: the P2 send flow draining a
backlog, end to end (ingest → provider accepted → status in Cassandra), next to the ceilings of
:mod:`notiflow.bench.ceilings` measured in the same run on the same topics and partitions.

Each pipeline gets a fresh phase and a backlog of ``n`` records produced before it starts, so
every figure is a drain rate. End to end: from the moment the send flow is ready to the latest
write time (Cassandra ``WRITETIME``) of a message's PROVIDER_ACCEPTED history row, read after
the run; the steady rate is the emulators' acceptance rate between the 10th and 90th
percentile of their timestamps (start-up and tail excluded).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from notiflow.bench.harness import UNBOUND_RATES, CampaignProducer, Phase, wait_until
from notiflow.bench.stats import profile_top, steady_rate
from notiflow.bench.workload import Workload, records
from notiflow.schemas.enums import Tier

TIER = Tier.P2
DONE_STATUSES = ("PROVIDER_ACCEPTED", "SENT", "DELIVERED", "BOUNCED", "FAILED")
_ENV = {"NOTIFLOW_PROVIDER_RATES": json.dumps(UNBOUND_RATES)}


def _backlog(phase: Phase, run_id: str, n: int, versions: dict[Any, int] | None
             ) -> Workload:
    workload = Workload(f"{run_id}{phase.name[:3]}")
    CampaignProducer(phase.settings).produce(records(workload, TIER, n, versions), TIER)
    return workload


def _status_written(phase: Phase, ids: list[str], timeout: float, *, last: int = 200
                    ) -> tuple[int, float | None]:
    """How many of ``ids`` (in the order the provider accepted them) have a
    PROVIDER_ACCEPTED-or-later history row, and the latest write time (epoch seconds) of
    those rows; waits up to ``timeout`` for stragglers. Polls the ``last`` accepted ones
    before reading them all: a full pass while the reconciler still writes would compete
    with the pipeline it measures (one read per message)."""
    from notiflow.adapters.cassandra.session import aio, connect

    async def read() -> tuple[int, float | None]:
        cluster, session = await asyncio.to_thread(connect, phase.settings)
        stmt = session.prepare("SELECT status, WRITETIME(applied) AS wt FROM message_events "
                               "WHERE message_id = ?")
        sem = asyncio.Semaphore(128)
        written: dict[str, float] = {}

        async def one(mid: str) -> None:
            async with sem:
                rows = await aio(session.execute_async(stmt, (mid,)))
            times = [r["wt"] for r in rows if r["status"] in DONE_STATUSES and r["wt"]]
            if times:
                written[mid] = min(times) / 1e6

        deadline = time.monotonic() + timeout
        pending = list(ids[-last:])
        try:
            for full in (False, True):
                if full:
                    pending = [m for m in ids if m not in written]
                while pending and time.monotonic() < deadline:
                    await asyncio.gather(*(one(m) for m in pending))
                    pending = [m for m in pending if m not in written]
                    if pending:
                        await asyncio.sleep(1)
        finally:
            cluster.shutdown()
        return len(written), max(written.values()) if written else None

    return asyncio.run(read())


class Profiler:
    """py-spy ``record`` on one process until :meth:`stop` (collapsed stacks). ``--gil``:
    only the thread holding the GIL is sampled, so the profile is Python CPU time, not time
    spent waiting inside librdkafka or the Cassandra driver's I/O thread."""

    def __init__(self, pid: int, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-f",
             "raw", "-o", str(path), "-r", "50", "--nonblocking", "--gil"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> dict[str, Any] | None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if not self.path.exists():
            return None
        return profile_top(self.path.read_text(errors="replace"))


def run_e2e(out: Path, run_id: str, n: int, *, processes: int = 1, profile: bool = False,
            name: str = "e2e", log: Callable[[str], None] = print) -> dict[str, Any]:
    phase = Phase(f"throughput-{name}", out, run_id, extra_env=_ENV)
    phase.prepare()
    profiles: dict[str, Any] = {}
    try:
        phase.start_platform()
        versions = phase.templates(["globex"])
        workload = _backlog(phase, run_id, n, versions)
        log(f"{name}: {n} P2 records queued; starting {processes} send process(es)")
        sends = phase.start_send(TIER, processes=processes)
        t0 = time.time()
        phase.sampler.start()
        spies = {}
        if profile:
            for p in [sends[0], *(x for x in phase.group.procs if x.name == "reconcile")]:
                assert p.proc is not None
                spies[p.name] = Profiler(p.proc.pid, out / f"profile-{run_id}-{p.name}.txt")
        provider_done = wait_until(lambda: phase.accepted_count(workload.prefix) >= n, 1800,
                                   interval=1.0, phase=phase)
        t_provider = time.time()
        for proc_name, spy in spies.items():
            prof = spy.stop()
            if prof:
                profiles[proc_name] = prof
        first = phase.first_accepts()
        ids = sorted((m for m in first if m.startswith(workload.prefix)), key=first.__getitem__)
        written, t_written = _status_written(phase, ids, 300)
        phase.check_alive()
    finally:
        phase.stop()
    t_end = t_written or t_provider
    send_cpu = sum(phase.sampler.cpu_between(p.name, t0, t_end) for p in sends)
    recon_cpu = phase.sampler.cpu_between("reconcile", t0, t_end)
    cpu_by = {p: round(phase.sampler.cpu_between(p, t0, t_end) * 1000 / n, 2)
              for p in phase.sampler.samples}
    return {
        "n": n, "processes": processes, "provider_done": provider_done,
        "status_written": written,
        "rate": round(n / (t_end - t0), 1),
        "steady_rate": _round(steady_rate(first[m] for m in ids)),
        "cpu_ms_per_msg": round((send_cpu + recon_cpu) * 1000 / n, 2),
        "send_cpu_ms_per_msg": round(send_cpu * 1000 / n, 2),
        "cpu_by_process": cpu_by, "procs": phase.sampler.table(t0, t_end),
        **_jit(phase, t0, t_end, n), **_machine(phase, t0, t_end, n), "profile": profiles,
    }


def _jit(phase: Phase, t0: float, t1: float, n: int) -> dict[str, Any]:
    """The stack's JIT compilers between ``t0`` and ``t1``: CPU ms per message of each JVM's
    compiler threads, and their share of those JVMs' CPU (None without a JVM sampled)."""
    names = phase.sampler.jvms()
    jit = {p: phase.sampler.jit_between(p, t0, t1) for p in names}
    cpu = sum(phase.sampler.cpu_between(p, t0, t1) for p in names)
    return {"jit_ms_per_msg": {p: round(s * 1000 / n, 3) for p, s in jit.items()},
            "jit_share": round(sum(jit.values()) / cpu, 3) if cpu else None,
            "jit_s": round(sum(jit.values()), 2), "jvm_cpu_s": round(cpu, 2)}


def _machine(phase: Phase, t0: float, t1: float, n: int) -> dict[str, Any]:
    """The whole machine between ``t0`` and ``t1``: busy CPU ms per message (every process
    and the kernel, watched or not) and the share of the cores left idle (None without host
    samples). A phase with idle cores was not bound by CPU alone."""
    both = phase.sampler.machine_between(t0, t1)
    if both is None or sum(both) <= 0:
        return {"machine_cpu_ms_per_msg": None, "machine_idle_share": None}
    busy, idle = both
    return {"machine_cpu_ms_per_msg": round(busy * 1000 / n, 2),
            "machine_idle_share": round(idle / (busy + idle), 3)}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def run_ceiling(kind: str, out: Path, run_id: str, n: int,
                log: Callable[[str], None], *, name: str | None = None) -> dict[str, Any]:
    phase = Phase(f"throughput-{name or kind}", out, run_id, extra_env=_ENV)
    phase.prepare()
    try:
        phase.watch_stack()
        if kind == "minimal":
            phase.start("fakes", ["fakes"], http=f"{phase.fakes}/_admin/health")
        workload = _backlog(phase, run_id, n, None)
        log(f"{kind}: {n} P2 records queued; running the {kind} pipeline")
        proc = phase.start(kind, ["bench", "ceiling", kind, "-n", str(n)])
        phase.sampler.start()
        t0 = time.time()
        assert proc.proc is not None
        proc.proc.wait(timeout=1800)
        t1 = time.time()
        line = next((x for x in proc.log_path.read_text().splitlines()
                     if x.startswith("BENCH-RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{kind} pipeline failed:\n{proc.tail(30)}")
        result = json.loads(line.removeprefix("BENCH-RESULT "))
        steady = None
        if kind == "minimal":
            first = phase.first_accepts()
            steady = steady_rate(first[m] for m in first if m.startswith(workload.prefix))
    finally:
        phase.stop()
    cpu_by = {p: round(phase.sampler.cpu_between(p, t0, t1) * 1000 / n, 2)
              for p in phase.sampler.samples if p != kind}
    return {**result, "rate": round(result["n"] / result["seconds"], 1),
            "steady_rate": _round(steady),
            "cpu_ms_per_msg": round(result["cpu_s"] * 1000 / result["n"], 2),
            "cpu_by_process": {kind: round(result["cpu_s"] * 1000 / result["n"], 2), **cpu_by},
            **_jit(phase, t0, t1, n), **_machine(phase, t0, t1, n)}


def empty_tables(out: Path, run_id: str) -> None:
    """Truncate the bench keyspace's tables (none yet on a new stack). Left full by earlier
    runs, they made Cassandra compact hundreds of MiB of old data at moments unrelated to the
    run (six compactions of ~45 MiB in one end-to-end phase, one in the next run's): the
    phase they fell in lost ~0.5 ms of CPU per message. Emptied, each run's phases compact
    only what the run wrote."""
    from notiflow.adapters.cassandra.session import connect

    settings = Phase("throughput-truncate", out, run_id, extra_env=_ENV).settings
    cluster, session = connect(settings, keyspace=None)
    try:
        ks = settings.cassandra_keyspace
        for row in session.execute("SELECT table_name FROM system_schema.tables "
                                   "WHERE keyspace_name = %s", (ks,)):
            if row["table_name"] == "schema_migrations":
                continue
            session.execute(f'TRUNCATE "{ks}"."{row["table_name"]}"', timeout=120)
    finally:
        cluster.shutdown()


WARMUP_ROUNDS = 10
JIT_QUIET = 0.05
"""The JVMs are warm once their JIT compilers used less than this share of their CPU during
a warm-up round."""


def warm_up(out: Path, run_id: str, n: int, warmup: int | None, log: Callable[[str], None],
            *, ceiling: bool, rounds: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """Empty the tables, then warm the JVMs, unmeasured, in rounds of ``warmup`` messages
    (default ``n // 2``) through the platform and then, when ``ceiling``, the minimal
    pipeline (the order of the measured phases), until the JIT compilers of Kafka and
    Cassandra used less than :data:`JIT_QUIET` of those JVMs' CPU in a round (at most
    ``rounds``, default :data:`WARMUP_ROUNDS`); then empty the tables again, so the measured
    phases compact only their own rows. Returns the round size and each round's JIT
    share.

    Why rounds, of both pipelines: the JVMs compile the paths a workload makes hot for
    minutes. After one warm-up of 3,000 messages per pipeline their compilers still took
    15 CPU seconds during a 30,000-message end-to-end phase (0.5 ms per message, a third of
    Cassandra's CPU there) and under one during the minimal pipeline's, which ran on JVMs the
    end-to-end phase had just warmed. Warmed by the platform alone, they recompiled once the
    minimal pipeline had run (its profile differs), and the end-to-end phase measured next
    paid for it."""
    warm = n // 2 if warmup is None else warmup
    empty_tables(out, run_id)
    done: list[dict[str, Any]] = []
    most = (WARMUP_ROUNDS if rounds is None else rounds) if warm > 0 else 0
    for i in range(most):
        phases = [run_e2e(out, run_id, warm, name=f"warmup{i + 1}", log=log)]
        if ceiling:
            phases.append(run_ceiling("minimal", out, run_id, warm, log,
                                      name=f"warmup{i + 1}-minimal"))
        jvm_cpu = sum(p["jvm_cpu_s"] for p in phases)
        share = round(sum(p["jit_s"] for p in phases) / jvm_cpu, 3) if jvm_cpu else None
        done.append({"messages": warm, "jit_share": share})
        log(f"warm-up round {i + 1}: JIT compilers "
            f"{'-' if share is None else f'{share:.0%}'} of the JVMs' CPU")
        if share is None or share < JIT_QUIET:
            break
    if done:
        empty_tables(out, run_id)
    return warm, done


def run(out: Path, *, n: int, profile: bool, log: Callable[[str], None],
        warmup: int | None = None, warmup_rounds: int | None = None) -> dict[str, Any]:
    """``warmup``, ``warmup_rounds``: messages per round and most rounds of
    :func:`warm_up` (None: its defaults)."""
    run_id = uuid.uuid4().hex[:6]
    warm, rounds = warm_up(out, run_id, n, warmup, log, ceiling=True,
                           rounds=warmup_rounds)
    e2e = run_e2e(out, run_id, n, profile=profile, log=log)
    minimal = run_ceiling("minimal", out, run_id, n, log)
    passthrough = run_ceiling("passthrough", out, run_id, n, log)
    return {"bench": "throughput", "run_id": run_id, "tier": TIER.value, "warmup": warm,
            "warmup_rounds": rounds, "e2e": {k: v for k, v in e2e.items() if k != "profile"},
            "minimal": minimal, "passthrough": passthrough, "profile": e2e["profile"],
            "ratio_minimal": e2e["rate"] / minimal["rate"],
            "ratio_passthrough": e2e["rate"] / passthrough["rate"]}


def run_scale(out: Path, *, n: int, processes: list[int], log: Callable[[str], None],
              warmup: int | None = None, warmup_rounds: int | None = None) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    warm, rounds = warm_up(out, run_id, n, warmup, log, ceiling=False,
                           rounds=warmup_rounds)
    runs = []
    for k in processes:
        r = run_e2e(out, run_id, n, processes=k, name=f"scale{k}", log=log)
        runs.append({"processes": k, "rate": r["rate"], "steady_rate": r["steady_rate"],
                     "cpu_ms_per_msg": r["send_cpu_ms_per_msg"],
                     "status_written": r["status_written"]})
    return {"bench": "scale", "run_id": run_id, "tier": TIER.value, "n": n, "warmup": warm,
            "warmup_rounds": rounds, "runs": runs}
