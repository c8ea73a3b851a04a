"""``notiflow bench isolation``: a P3 campaign flood and P0 OTPs at a steady rate, in the
tier-isolated platform and in the ``shared`` baseline, measured in one run.

Per mode: a fresh phase (topics, processes); the P3 campaign (``n`` records, the workload's
channel mix) is produced to the ingest topics as fast as Kafka takes them, while P0 OTPs go
through the Messaging API at ``otp_rate``/s until the campaign has drained (every P3 message
accepted by an emulator) or ``max_drain`` seconds passed. Latency = the emulator's receipt time
of a message's first accepted request - its acceptance time (the API's ``accepted_at`` for
OTPs, the moment the record was handed to the producer for the campaign): one machine, one
clock.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from notiflow import names
from notiflow.bench import calibrate, host, jvm
from notiflow.bench.harness import CampaignProducer, OtpStream, Phase, wait_until
from notiflow.bench.otlp import (
    EXPORT_INTERVAL_S,
    StageCollector,
    budget,
    exporter_env,
    stalls,
    yielded,
)
from notiflow.bench.stats import summary
from notiflow.bench.summary import latency_windows
from notiflow.bench.warmup import UPSTREAM_NICE, warm_up
from notiflow.bench.workload import REGIONS, PhoneFactory, Workload, records
from notiflow.ops.stack.base import paths
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings

TIMELINE_POINTS = 4000
"""Points per tier kept in the full JSON's timeline; the plot draws ``latency``, the windows
of every message (:func:`notiflow.bench.summary.latency_windows`)."""


def run_mode(mode: str, out: Path, run_id: str, n: int, otp_rate: float, max_drain: float,
             log: Callable[[str], None], p3_rate: float | None = None,
             extra_env: Mapping[str, str] | None = None,
             warmup: float | None = None, record_budget: bool = True) -> dict[str, Any]:
    """One mode; ``p3_rate``: produce the campaign at that steady rate instead of a flood
    (the soak run); ``extra_env``: settings of the phase's processes; ``record_budget``
    False: the processes export no metrics (what the budget's recording itself costs)."""
    collector = StageCollector().__enter__() if record_budget else None
    exporting = exporter_env(collector.endpoint) if collector else {}
    phase = Phase(f"isolation-{mode}", out, run_id, mode=mode,
                  extra_env={**(extra_env or {}), **exporting})
    phase.prepare()
    try:
        phase.start_platform()
        if mode == "shared":
            phase.start_send(None)
        else:
            for tier in (Tier.P0, Tier.P3):
                phase.start_send(tier)
        phase.sampler.start()
        versions = phase.templates(["acme", "mkt"])
        workload = Workload(f"{run_id}{mode[0]}")
        phones = PhoneFactory(REGIONS, datetime.now(UTC), start=500_000)

        warm = warm_up(phase, versions, phones, otp_rate, f"{run_id}{mode[0]}", log,
                       **({"bound_s": warmup} if warmup is not None else {}))
        log(f"{mode}: warm; flooding P3 with {n} messages, P0 OTPs at {otp_rate}/s")

        campaign = CampaignProducer(phase.settings, nice=UPSTREAM_NICE)
        flood = threading.Thread(target=campaign.produce,
                                 args=(records(workload, Tier.P3, n, versions), Tier.P3,
                                       p3_rate))
        otps = OtpStream(phase, versions, otp_rate, phones, f"otp-{run_id}-{mode}")
        speed = {"before": calibrate.speed()}
        t0 = time.time()
        flood.start()
        otps.start()
        drained = wait_until(lambda: phase.accepted_count(workload.prefix) >= n,
                             max_drain, interval=2.0, phase=phase)
        accepted_otps, refused = otps.stop()
        flood.join()
        wait_until(lambda: phase.accepted_count("msg_") - phase.accepted_count("msg_bench_")
                   >= len(accepted_otps) + warm.otps, 60)
        t1 = time.time()
        first = phase.first_accepts()
        phase.check_alive()
        speed["after"] = calibrate.speed()
    finally:
        phase.stop()
        if collector:
            collector.__exit__(None, None, None)
    doc = _figures(mode, n, otp_rate, drained, t0, t1, campaign, accepted_otps,
                   refused, first, phase)
    doc["warmup"] = warm.as_json()
    doc["cpu_timeline"] = phase.sampler.cpu_timeline(t0, t1)
    logs = paths(phase.settings).logs
    doc["jvm_pauses"] = {name: jvm.summary(logs / f"{name}-gc.log", t0, t1)
                         for name in ("cassandra", "kafka")}
    machine = host.timeline(phase.sampler.host_samples, t0, t1)
    held = host.blocked_timeline(phase.sampler.blocked, t0, t1)
    doc["host"] = {"summary": host.summary(machine), "timeline": machine,
                   "blocked": host.blocked_summary(held), "speed": speed}
    doc["budget_recorded"] = collector is not None
    if collector is None:
        return doc
    points = collector.points()
    doc["budget"] = {tier: budget(points, tier, t0, t1) for tier in ("P0", "P3")}
    doc["stalls"] = stalls(points, "P0", t0)
    doc["host"]["at_stalls"] = host.at_stalls(machine, doc["stalls"], EXPORT_INTERVAL_S, held)
    doc["gc_pauses"] = collector.gc_pauses(t0, t1)
    window = collector.gauge(names.BULK_WINDOW)
    doc["bulk_window"] = {**yielded(window, t0, t1),
                          "timeline": [(round(t - t0, 1), v) for t, v in window if t >= t0]}
    return doc


def _figures(mode: str, n: int, otp_rate: float, drained: bool, t0: float, t1: float,
             campaign: CampaignProducer, otps: dict[str, float], refused: int,
             first: dict[str, float], phase: Phase) -> dict[str, Any]:
    p0 = [(first[m], (first[m] - at) * 1000) for m, at in otps.items() if m in first]
    p3 = [(first[m], (first[m] - at) * 1000) for m, at in campaign.accepted_at.items()
          if m in first]
    p3_times = [t for t, _ in p3]
    drain_s = (max(p3_times) - min(p3_times)) if p3_times else None
    processes = phase.sampler.table(t0, t1)
    return {
        "mode": mode, "n": n, "otp_rate": otp_rate, "drained": drained,
        "wall_s": round(t1 - t0, 1),
        "produce_rate": round(n / max(1e-9, campaign.finished - campaign.started)),
        "p0": {**summary([lat for _, lat in p0]), "sent": len(otps), "refused": refused,
               "missing": len(otps) - len(p0)},
        "p3": {**summary([lat for _, lat in p3]), "missing": n - len(p3),
               "drain_s": round(drain_s, 1) if drain_s else None,
               "drain_rate": round(len(p3) / drain_s) if drain_s else None},
        "timeline": {"p0": [(round(t - t0, 3), round(lat, 1)) for t, lat in sorted(p0)],
                     "p3": _thin([(round(t - t0, 3), round(lat, 1)) for t, lat in sorted(p3)])},
        "latency": latency_windows({"p0": [(t - t0, lat) for t, lat in p0],
                                    "p3": [(t - t0, lat) for t, lat in p3]}),
        "processes": processes,
    }


def _thin(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    step = max(1, len(points) // TIMELINE_POINTS)
    return points[::step]


def run(out: Path, *, n: int, otp_rate: float, modes: list[str], max_drain: float,
        log: Callable[[str], None], warmup: float | None = None,
        record_budget: bool = True) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    results = {m: run_mode(m, out, run_id, n, otp_rate, max_drain, log, warmup=warmup,
                           record_budget=record_budget)
               for m in modes}
    doc: dict[str, Any] = {"bench": "isolation", "run_id": run_id, "modes": results}
    tiered, shared = results.get("tiered"), results.get("shared")
    if tiered and shared and tiered["p0"]["p99"] and shared["p0"]["p99"]:
        doc["p0_p99_ratio_shared_over_tiered"] = round(shared["p0"]["p99"]
                                                       / tiered["p0"]["p99"], 1)
    return doc


def soak_env(settings: Settings, cap_window: timedelta) -> dict[str, str]:
    """Settings of a soak's processes: every recipient cap keeps its limit but counts over
    ``cap_window``. Cap state (sorted sets in Redis) is by design one entry per message let
    through in the window (OTP: 10 minutes, marketing: 7 days); a window shorter than half
    the run lets it reach its steady size in the first half."""
    caps = {c.value: {"limit": r.limit, "window": cap_window.total_seconds()}
            for c, r in settings.caps.items()}
    return {"NOTIFLOW_CAPS": json.dumps(caps)}


def run_soak(out: Path, *, minutes: float, p3_rate: float, otp_rate: float,
             log: Callable[[str], None],
             cap_window: timedelta = timedelta(minutes=1),
             warmup: float | None = None, record_budget: bool = True) -> dict[str, Any]:
    """Tier-isolated platform under a steady P3 load and P0 OTPs for ``minutes``: latency and
    each process's RSS when the load started, at half time and when it ended."""
    from notiflow.settings import load_settings

    run_id = uuid.uuid4().hex[:6]
    n = int(minutes * 60 * p3_rate)
    r = run_mode("tiered", out, run_id, n, otp_rate, minutes * 60 + 600, log, p3_rate=p3_rate,
                 extra_env=soak_env(load_settings(), cap_window), warmup=warmup,
                 record_budget=record_budget)
    return {"bench": "soak", "run_id": run_id, "minutes": minutes, "p3_rate": p3_rate,
            "cap_window_s": cap_window.total_seconds(), "modes": {"soak": r}}
