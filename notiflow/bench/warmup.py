"""Warming a phase up before it measures: waves of P3 and P0 traffic until P0's latency settles.

On a stack just started, Cassandra's JIT compiler and its first compactions took most of a core
for about a minute of load, and P0's latency with them: a 2-minute run with almost no P3
measured P0 p50 540, 290, 320, 440 ms in its first four 10-second windows, then 120, 70, 56 ms
(docs/decisions/2026-12-03-benchmark-protocol.md). That is the JVMs', not the platform's, so
every measured
phase first sends waves of :data:`WAVE_S` seconds (P3 at :data:`P3_RATE`, OTPs at the measured
rate) until a wave's P0 p99 is under :data:`SETTLED_P99_MS` and its p50 within 20 % of the
wave before (the stop rule of ``notiflow demo``), or :data:`BOUND_S` passed. The waves'
figures go into the report.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from notiflow.bench.harness import CampaignProducer, Phase, send_otps, wait_until
from notiflow.bench.workload import PhoneFactory, Workload, records
from notiflow.ops.demo_report import Verdict, Wave, quantile, warmup_verdict
from notiflow.schemas.enums import Channel, Tier

WAVE_S = 10.0
P3_RATE = 50.0
BOUND_S = 180.0
SETTLED_P99_MS = 250.0
WARM_PHONES = 250_000
"""First phone serial of the warm-up's P3 SMS (the flood's start at 0, the OTPs' at 500,000)."""
UPSTREAM_NICE = 10
"""Niceness of the producing thread: upstream services have machines of their own."""


@dataclass
class WarmUp:
    """What the warm-up sent and how P0's latency went, wave by wave."""

    waves: list[Wave] = field(default_factory=list)
    verdict: Verdict = Verdict.GO_ON
    seconds: float = 0.0
    otps: int = 0
    p3: int = 0

    def as_json(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 1), "otps": self.otps, "p3": self.p3,
                "verdict": self.verdict.value,
                "waves": [{"p50_ms": w.p50, "p99_ms": w.p99, "seconds": round(w.seconds, 1)}
                          for w in self.waves]}


def warm_up(phase: Phase, versions: dict[tuple[str, Channel], int], phones: PhoneFactory,
            otp_rate: float, key: str, log: Callable[[str], None],
            bound_s: float = BOUND_S) -> WarmUp:
    """Waves until P0 settles or ``bound_s`` passed; ``bound_s`` 0: one small wave, which
    only shows that every process is up. Raises when a wave never drains."""
    warm = WarmUp()
    workload = Workload(f"warm{key}", phone_start=WARM_PHONES)
    start = time.monotonic()
    while True:
        small = bound_s <= 0
        wave = _wave(phase, versions, phones, workload, otp_rate, f"{key}w{len(warm.waves)}",
                     n_p3=20 if small else int(WAVE_S * P3_RATE),
                     n_otps=5 if small else int(WAVE_S * otp_rate))
        warm.waves.append(wave.figures)
        warm.otps += wave.otps
        warm.p3 += wave.p3
        warm.seconds = time.monotonic() - start
        log(f"warm-up wave {len(warm.waves)}: P0 p50 {wave.figures.p50:.0f} ms, p99 "
            f"{wave.figures.p99:.0f} ms")
        warm.verdict = (Verdict.BOUND if small else warmup_verdict(
            warm.waves, warm.seconds, sla_ms=SETTLED_P99_MS, bound=bound_s))
        if warm.verdict is not Verdict.GO_ON:
            drain_p3(phase, warm)
            return warm


def drain_p3(phase: Phase, warm: WarmUp, timeout: float = 600.0) -> None:
    """Wait until every warm-up P3 message reached an emulator (a P3 flow yielding to a cold
    P0 drains them slowly), so the measured flood starts on an empty P3 queue."""
    if not wait_until(lambda: phase.accepted_count("msg_bench_warm") >= warm.p3, timeout,
                      interval=2.0, phase=phase):
        raise RuntimeError("the warm-up's P3 messages never reached the emulators")


@dataclass(frozen=True)
class _Sent:
    figures: Wave
    otps: int
    p3: int


def _wave(phase: Phase, versions: dict[tuple[str, Channel], int], phones: PhoneFactory,
          workload: Workload, otp_rate: float, key: str, *, n_p3: int, n_otps: int) -> _Sent:
    """One wave: ``n_p3`` P3 messages at :data:`P3_RATE` with ``n_otps`` OTPs at
    ``otp_rate``; returns once every one reached an emulator."""
    began = time.monotonic()
    producer = CampaignProducer(phase.settings, nice=UPSTREAM_NICE)
    thread = threading.Thread(target=producer.produce, args=(
        records(workload, Tier.P3, n_p3, versions), Tier.P3, P3_RATE))
    thread.start()
    otps, _ = asyncio.run(send_otps(phase, versions, otp_rate, threading.Event(), phones,
                                    f"warm-{key}", max_count=n_otps))
    thread.join()
    first: dict[str, float] = {}

    def arrived() -> bool:
        first.update(phase.first_accepts())
        return all(m in first for m in otps)

    if not wait_until(arrived, 120.0, interval=2.0, phase=phase):
        raise RuntimeError("a warm-up wave's OTPs never reached the emulators")
    lat = sorted((first[m] - at) * 1000 for m, at in otps.items())
    return _Sent(Wave(len(otps) + n_p3, time.monotonic() - began, quantile(lat, 50),
                      quantile(lat, 99)), len(otps), n_p3)
