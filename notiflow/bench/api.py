"""``notiflow bench api``: the acceptance path under open-loop load, next to its minimal ceiling.

One phase (its own topics and Redis namespace, the bench keyspace) runs the API as the
tier-isolated platform deploys it — a priority-lane process for P0/P1 and a bulk-lane process
for P2/P3 (``notiflow api --lane …``, their niceness and real-time class included) — and the
acceptance ceiling (:mod:`notiflow.bench.api_ceiling`), no flows and no emulators. Each mode
is an ascent of fixed offered rates (messages/s): steps of ``warmup_s`` unmeasured seconds
then ``duration_s`` measured ones of the open-loop generator (:mod:`notiflow.bench.openloop`),
until a step accepts under ``min_share`` of what it offered or its p99 passes
``p99_bound_ms`` (``stop``), or ``steps`` steps ran. A mode's maximum is its best accepted/s.

- ``ceiling``: single requests (the P0 body) to the ceiling;
- ``batch-ceiling``: batches of ``batch_size`` P3 bodies to the ceiling's batch endpoint
  (what a batch of durable acceptances cannot do without on this machine: the bound of
  ``batch-p3``);
- ``single-p0``: ``POST /v1/messages`` of P0 OTPs to the priority lane (tenant ``acme``);
- ``single-p3``: P3 marketing SMS to the bulk lane (tenant ``mkt``);
- ``user-p3``: the same message to a user (``recipient: "user:<id>"``, SMS allowed; 500
  users with a phone and an email address each): the API reads the user and the state of
  each address before it accepts, the cost ``single-p3`` does not pay;
- ``batch-p3``: ``POST /v1/messages:batch`` of ``batch_size`` P3 items to the bulk lane;
- ``p0-half`` (after ``single-p0``): one step of P0 at half its maximum, once the stack is
  quiet again (:func:`_quiet`; the ascent before it saturates the stack).

Every step records the CPU seconds of each process — both API processes (each with its worker
children: ``--api-processes``), the ceiling, Kafka, Cassandra, Redis, the object store, and
the generator (``bench``, this process) — from the first measured request's due time to the
last answer, per accepted message (:mod:`notiflow.bench.proc_cpu`).
Provider rates are lifted (``UNBOUND_RATES``) so that P0's admission envelope does not refuse
what the acceptance path could take.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil

from notiflow.adapters.cassandra.session import connect
from notiflow.bench import openloop
from notiflow.bench.api_requests import Target, session, sms_body, user_body
from notiflow.bench.cassandra_quiet import background
from notiflow.bench.harness import UNBOUND_RATES, Phase
from notiflow.bench.proc_cpu import at_rest, cpu_now, wait_quiet
from notiflow.bench.workload import REGIONS, TENANT_BY_TIER, PhoneFactory
from notiflow.devenv import free_port
from notiflow.ops.stack import Stack
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

MODES = ("ceiling", "batch-ceiling", "single-p0", "single-p3", "user-p3", "batch-p3")
BATCH_MODES = frozenset({"batch-ceiling", "batch-p3"})
SERVER = {"ceiling": "ceiling", "batch-ceiling": "ceiling", "single-p0": "api",
          "single-p3": "api-bulk", "user-p3": "api-bulk", "batch-p3": "api-bulk",
          "p0-half": "api"}
"""The process each mode loads."""
P0_HALF_TARGET_MS = 50.0
PHONES = 500
"""Distinct recipients the bodies cycle through (acceptance checks no recipient caps)."""


@dataclass(frozen=True)
class Plan:
    """How each mode ascends. Rates are messages/s (a batch step sends ``rate /
    batch_size`` requests/s); the batch modes start at ten times ``start``."""

    duration_s: float = 10.0
    warmup_s: float = 3.0
    steps: int = 14
    start: float = 20.0
    factor: float = 1.5
    batch_size: int = 100
    p99_bound_ms: float = 1000.0
    min_share: float = 0.95
    cap: int = 10_000
    timeout_s: float = 30.0
    prewarm_s: float = 30.0
    """Unmeasured single P3 load at ``2 * start``/s before the first mode (JVMs' JIT)."""
    idle_s: float = 5.0
    """Seconds at rest, before any load, whose CPU per process is reported: at low rates
    the background work (outbox sweeps, compactions, the brokers' own timers) is a large
    part of a step's CPU per message."""
    starts: Mapping[str, float] = field(default_factory=dict)
    """Per-mode first rates overriding ``start``."""

    def first_rate(self, mode: str) -> float:
        return self.starts.get(mode, self.start * (10 if mode in BATCH_MODES else 1))


QUICK = Plan(duration_s=2.0, warmup_s=0.5, steps=2, prewarm_s=0.0, idle_s=1.0)
"""A smoke run: two short steps per mode, no pre-warming."""


def _scheduling(proc: psutil.Process) -> dict[str, Any]:
    try:
        policy = os.sched_getscheduler(proc.pid)
        return {"nice": proc.nice(), "realtime": policy in (os.SCHED_RR, os.SCHED_FIFO)}
    except (psutil.Error, OSError):
        return {}


async def step(target: Target, rate: float, plan: Plan, procs: Mapping[str, psutil.Process],
               per_request: int) -> dict[str, Any]:
    """One step at ``rate`` messages/s: its figures (:func:`openloop.figures`), the requests
    that found the cap full, and CPU ms per accepted message of every process."""
    due = openloop.schedule(rate / per_request, plan.warmup_s + plan.duration_s)
    first = bisect.bisect_left(due, plan.warmup_s)
    before: dict[str, float] = cpu_now(procs)

    def mark() -> None:
        before.update(cpu_now(procs))

    run = await openloop.open_loop(target.send, due, cap=plan.cap, per_request=per_request,
                                   hooks={first: mark})
    after = cpu_now(procs)
    figures = openloop.figures(run.sent, since=plan.warmup_s,
                               until=plan.warmup_s + plan.duration_s, per_request=per_request)
    return {"rate": rate, **figures, "capped": run.capped,
            "cpu_ms_per_msg": openloop.cpu_ms_per_message(before, after,
                                                          figures["accepted"])}


async def ascend(target: Target, rates: list[float], plan: Plan,
                 procs: Mapping[str, psutil.Process], per_request: int,
                 log: Callable[[str], None], label: str) -> dict[str, Any]:
    """Steps at ``rates`` until the stop rule fires: the steps, why it stopped (None: every
    rate ran), and the best accepted/s."""
    steps: list[dict[str, Any]] = []
    stop = None
    for rate in rates:
        s = await step(target, rate, plan, procs, per_request)
        steps.append(s)
        log(_line(label, s))
        stop = openloop.stop_reason(s, min_share=plan.min_share,
                                    p99_bound_ms=plan.p99_bound_ms)
        if stop:
            break
    return {"steps": steps, "stop": stop,
            "max_per_s": max((s["accepted_per_s"] for s in steps), default=0.0)}


def _line(label: str, s: Mapping[str, Any]) -> str:
    refused = ", ".join(f"{k} {v}" for k, v in s["refused"].items())
    return (f"  {label} {s['offered_per_s']:,.0f}/s offered: {s['accepted_per_s']:,.0f}/s "
            f"accepted, p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, max {s['max_ms']} ms"
            + (f"; not accepted: {refused}" if refused else "")
            + (f"; {s['capped']} waited for the cap" if s["capped"] else ""))


@dataclass(frozen=True)
class _Mode:
    url: str
    token: str
    bodies: list[dict[str, Any]]
    size: int = 1


def _targets(phase: Phase, ceiling_url: str, versions: dict[tuple[str, Channel], int],
             plan: Plan, run_id: str) -> dict[str, _Mode]:
    p0, p3 = TENANT_BY_TIER[Tier.P0], TENANT_BY_TIER[Tier.P3]
    factory = PhoneFactory(REGIONS, datetime.now(UTC))
    phones = [factory.take() for _ in range(PHONES)]
    p0_bodies = [sms_body(Tier.P0, ph, versions[(p0, Channel.SMS)], i)
                 for i, ph in enumerate(phones)]
    p3_bodies = [sms_body(Tier.P3, ph, versions[(p3, Channel.SMS)], i)
                 for i, ph in enumerate(phones)]
    p0_mode = _Mode(f"{phase.api}/v1/messages", phase.tokens[p0], p0_bodies)
    users = _users(phase, p3, phones, run_id)
    user_bodies = [user_body(u, versions[(p3, Channel.SMS)], i) for i, u in enumerate(users)]
    return {"ceiling": _Mode(f"{ceiling_url}/v1/messages", phase.tokens[p0], p0_bodies),
            "batch-ceiling": _Mode(f"{ceiling_url}/v1/messages:batch", phase.tokens[p3],
                                   p3_bodies, plan.batch_size),
            "single-p0": p0_mode, "p0-half": p0_mode,
            "single-p3": _Mode(f"{phase.bulk_api}/v1/messages", phase.tokens[p3], p3_bodies),
            "user-p3": _Mode(f"{phase.bulk_api}/v1/messages", phase.tokens[p3], user_bodies),
            "batch-p3": _Mode(f"{phase.bulk_api}/v1/messages:batch", phase.tokens[p3],
                              p3_bodies, plan.batch_size)}


def _users(phase: Phase, tenant: str, phones: list[str], run_id: str) -> list[str]:
    """One user per phone (the phone and an email address each), imported through the
    API; their ids."""
    ids = [f"bench-{run_id}-{i}" for i in range(len(phones))]
    with httpx.Client(base_url=phase.api, timeout=60) as client:
        r = client.post("/v1/users:batch", headers=phase.auth(tenant), json={"users": [
            {"user_id": u, "phones": [ph], "emails": [f"{u}@example.com"], "in_app": False}
            for u, ph in zip(ids, phones, strict=True)]})
        r.raise_for_status()
        refused = [x for x in r.json()["results"] if x["status"] not in (200, 201)]
        if refused:
            raise RuntimeError(f"bench users refused: {refused[:3]}")
    return ids


async def _run_mode(mode: _Mode, key: str, rates: list[float], plan: Plan,
                    procs: Mapping[str, psutil.Process], log: Callable[[str], None],
                    label: str) -> dict[str, Any]:
    async with session(plan.cap, plan.timeout_s) as client:
        target = Target(client, mode.url, mode.token, mode.bodies, key, mode.size)
        return await ascend(target, rates, plan, procs, mode.size, log, label)


async def _prewarm(mode: _Mode, key: str, rate: float, plan: Plan) -> dict[str, Any]:
    async with session(plan.cap, plan.timeout_s) as client:
        target = Target(client, mode.url, mode.token, mode.bodies, key, mode.size)
        run = await openloop.open_loop(target.send, openloop.schedule(rate, plan.prewarm_s),
                                       cap=plan.cap)
    return openloop.figures(run.sent, since=0.0, until=plan.prewarm_s, per_request=1)


def _watch(phase: Phase) -> dict[str, psutil.Process]:
    procs = {p.name: psutil.Process(p.proc.pid) for p in phase.group.procs
             if p.proc is not None}
    for name, pid, _port, healthy in Stack(phase.settings, log=lambda _m: None).status():
        if pid and healthy:
            procs[name] = psutil.Process(pid)
    procs["bench"] = psutil.Process(os.getpid())
    return procs


def _quiet(settings: Settings, procs: Mapping[str, psutil.Process],
           rest: Mapping[str, float], log: Callable[[str], None]) -> dict[str, Any]:
    """Wait until Cassandra and Kafka are back near their CPU at rest and Cassandra runs no
    compaction or flush (at most 90 s): the ``single-p0`` ascent before ``p0-half``
    saturates the stack, and ``p0-half`` measures P0's tail at half load, not while
    Cassandra compacts what the ascent wrote."""
    cluster, session = connect(settings)
    try:
        quiet = wait_quiet(lambda: cpu_now(procs), rest, busy=lambda: background(session))
    finally:
        cluster.shutdown()
    log(f"p0-half: waited {quiet['waited_s']:.0f} s for the stack to be quiet"
        + (" (timed out)" if quiet["timed_out"] else "") + ": "
        + ", ".join(f"{n} {v:.2f}" for n, v in quiet["cpu"].items())
        + "".join(f"; {b}" for b in quiet["busy"]))
    return quiet


def _loop() -> asyncio.Runner:
    import uvloop

    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def run(out: Path, *, plan: Plan, modes: list[str], log: Callable[[str], None],
        api_processes: int = 1) -> dict[str, Any]:
    """Every mode of ``modes`` (in :data:`MODES` order) and, after ``single-p0``, ``p0-half``
    (once the stack is quiet again, :func:`_quiet`); the report document. Each API lane
    runs ``api_processes`` worker processes (``notiflow api --processes``)."""
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    run_id = uuid.uuid4().hex[:6]
    phase = Phase("api", out, run_id,
                  extra_env={"NOTIFLOW_PROVIDER_RATES": json.dumps(UNBOUND_RATES)})
    phase.prepare()
    ceiling_port = free_port()
    ceiling_url = f"http://127.0.0.1:{ceiling_port}"
    doc: dict[str, Any] = {"bench": "api", "run_id": run_id,
                           "plan": asdict(plan), "api_processes": api_processes,
                           "modes": {}}
    try:
        workers = ["--processes", str(api_processes)]
        phase.start("api", ["api", "--lane", "priority", *workers], http=f"{phase.api}/healthz")
        phase.start("api-bulk", ["api", "--lane", "bulk", "--port", str(phase.bulk_port),
                                 *workers], http=f"{phase.bulk_api}/healthz")
        phase.start("ceiling", ["bench", "api-ceiling", "--port", str(ceiling_port)],
                    http=f"{ceiling_url}/healthz")
        versions = phase.templates([TENANT_BY_TIER[Tier.P0], TENANT_BY_TIER[Tier.P3]])
        targets = _targets(phase, ceiling_url, versions, plan, run_id)
        procs = _watch(phase)
        doc["processes"] = {name: _scheduling(p) for name, p in procs.items()}
        if plan.idle_s > 0:
            doc["at_rest"] = at_rest(procs, plan.idle_s)
        with _loop() as runner:
            if plan.prewarm_s > 0:
                log(f"pre-warming: single P3 at {2 * plan.start:,.0f}/s for "
                    f"{plan.prewarm_s:.0f} s (unmeasured)")
                doc["prewarm"] = runner.run(_prewarm(targets["single-p3"], f"{run_id}-warm",
                                                     2 * plan.start, plan))
            for mode in (m for m in MODES if m in modes):
                phase.check_alive()
                rates = openloop.ascent(plan.first_rate(mode), plan.factor, plan.steps)
                log(f"{mode}: {SERVER[mode]}, rates {rates[0]:,.0f}/s x {plan.factor} …")
                doc["modes"][mode] = {"server": SERVER[mode], **runner.run(_run_mode(
                    targets[mode], f"{run_id}-{mode}", rates, plan, procs, log, mode))}
                if mode == "single-p0" and doc["modes"][mode]["max_per_s"] > 0:
                    half = round(doc["modes"][mode]["max_per_s"] / 2, 1)
                    quiet = _quiet(phase.settings, procs, doc.get("at_rest") or {}, log)
                    log(f"p0-half: P0 at half its maximum, {half:,.0f}/s")
                    half_run = runner.run(_run_mode(targets["p0-half"], f"{run_id}-p0-half",
                                                    [half], plan, procs, log, "p0-half"))
                    doc["modes"]["p0-half"] = {"server": "api", "quiet": quiet, **half_run}
        phase.check_alive()
    finally:
        phase.stop()
    doc["targets"] = targets_met(doc["modes"])
    return doc


def targets_met(modes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The acceptance targets from the modes measured: single acceptance ÷ ceiling (≥ 50 %),
    batch ÷ single P3 in messages/s (≥ 10x), P0 p99 at half its maximum (≤ 50 ms); the
    batch ceiling's share taken by batch and its multiple of single P3 (the most batch ÷
    single could reach here); and which modes' maxima are saturation (their ascent
    stopped) rather than lower bounds."""
    def best(mode: str) -> float | None:
        m = modes.get(mode)
        return m["max_per_s"] if m and m["max_per_s"] > 0 else None

    def ratio(a: float | None, b: float | None, digits: int) -> float | None:
        return None if a is None or b is None else round(a / b, digits)

    ceiling, batch_ceiling, p0, p3, batch, user = (
        best(m) for m in ("ceiling", "batch-ceiling", "single-p0", "single-p3", "batch-p3",
                          "user-p3"))
    half = (modes.get("p0-half") or {}).get("steps") or []
    p99 = half[0]["p99_ms"] if half else None
    return {"saturated": {m: modes[m].get("stop") is not None for m in MODES if m in modes},
            "single_p0_over_ceiling": ratio(p0, ceiling, 3),
            "single_p3_over_ceiling": ratio(p3, ceiling, 3),
            "batch_over_single_p3": ratio(batch, p3, 2),
            "user_over_single_p3": ratio(user, p3, 3),
            "user_cpu_over_single_p3": _cpu_ratio(modes, "user-p3", "single-p3"),
            "batch_over_batch_ceiling": ratio(batch, batch_ceiling, 3),
            "batch_ceiling_over_single_p3": ratio(batch_ceiling, p3, 2),
            "p0_half_rate": half[0]["offered_per_s"] if half else None,
            "p0_half_p99_ms": p99,
            "p0_half_met": None if p99 is None else p99 <= P0_HALF_TARGET_MS}


def _cpu_ratio(modes: Mapping[str, Mapping[str, Any]], a: str, b: str) -> float | None:
    """The bulk API's CPU ms per message of mode ``a`` over ``b``, each at its step of most
    accepted/s (at low rates the processes' background work outweighs the messages)."""
    def at_max(mode: str) -> float | None:
        steps = (modes.get(mode) or {}).get("steps") or []
        if not steps:
            return None
        best = max(steps, key=lambda s: s["accepted_per_s"])
        return (best.get("cpu_ms_per_msg") or {}).get("api-bulk")

    x, y = at_max(a), at_max(b)
    return None if x is None or not y else round(x / y, 2)
