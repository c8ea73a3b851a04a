"""``notiflow bench envelope``: what sealing the recipient and variables of ingest records
costs per message (``adapters/envelope.py``), offline.

The records are the benchmark workload's (about 2 KB, push 60 % / email 30 % / SMS 10 %).
Each round times, over every record, the two places a message pays: the producer writing
its payload (``dump``: the API, the scheduler, a retry) and the send flow reading it
(``load``), in clear and sealed, as CPU time of this process. The figures are the medians of
the rounds; the payload growth is measured on the same records."""

from __future__ import annotations

import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from notiflow.adapters.envelope import Clear, Envelope, Sealer, dump, load, new_key, parse_keys
from notiflow.bench.workload import Workload, records
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import IngestRecord

CASES = ("dump", "load")


def _dump_us(recs: list[IngestRecord], sealer: Sealer) -> float:
    start = time.process_time_ns()
    for r in recs:
        dump(r, sealer)
    return (time.process_time_ns() - start) / len(recs) / 1000


def _load_us(payloads: list[str], sealer: Sealer) -> float:
    start = time.process_time_ns()
    for p in payloads:
        load(p, sealer)
    return (time.process_time_ns() - start) / len(payloads) / 1000


def run(n: int = 20_000, rounds: int = 7, seed: int = 7,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Time ``dump`` and ``load`` of ``n`` workload records, clear and sealed, ``rounds``
    times (the first round is a warm-up and not counted)."""
    workload = Workload(run_id="envelope", seed=seed)
    recs = [IngestRecord.model_validate_json(g.value) for g in records(workload, Tier.P3, n)]
    sealers: dict[str, Sealer] = {"clear": Clear(),
                                  "sealed": Envelope(parse_keys(new_key("bench")))}
    payloads = {mode: [dump(r, s) for r in recs] for mode, s in sealers.items()}
    samples: dict[str, dict[str, list[float]]] = {
        mode: {case: [] for case in CASES} for mode in sealers}
    for i in range(rounds + 1):
        for mode, sealer in sealers.items():
            dumped, loaded = _dump_us(recs, sealer), _load_us(payloads[mode], sealer)
            if i:
                samples[mode]["dump"].append(dumped)
                samples[mode]["load"].append(loaded)
        log(f"round {i}/{rounds}" + (" (warm-up)" if not i else ""))
    median = {mode: {case: statistics.median(v) for case, v in cases.items()}
              for mode, cases in samples.items()}
    size = {mode: statistics.mean(len(p.encode()) for p in texts)
            for mode, texts in payloads.items()}
    extra = {case: median["sealed"][case] - median["clear"][case] for case in CASES}
    return {
        "benchmark": "envelope", "records": n, "rounds": rounds,
        "median_us": median,
        "spread_us": {mode: {case: [min(v), max(v)] for case, v in cases.items()}
                      for mode, cases in samples.items()},
        "extra_us": extra, "extra_total_us": extra["dump"] + extra["load"],
        "payload_bytes": size, "extra_bytes": size["sealed"] - size["clear"],
    }


def envelope_markdown(doc: dict[str, Any]) -> str:
    m, spread = doc["median_us"], doc["spread_us"]
    lines = [
        f"# Ingest envelope encryption: cost per message ({doc['records']:,} workload "
        f"records, median of {doc['rounds']} rounds, CPU time)", "",
        "| step | clear (µs) | sealed (µs) | extra (µs) |", "|---|---|---|---|"]
    for case, what in (("dump", "write the payload (API, scheduler, retry)"),
                       ("load", "read it (send flow)")):
        lines.append(
            f"| {what} | {m['clear'][case]:.1f} ({spread['clear'][case][0]:.1f}-"
            f"{spread['clear'][case][1]:.1f}) | {m['sealed'][case]:.1f} "
            f"({spread['sealed'][case][0]:.1f}-{spread['sealed'][case][1]:.1f}) | "
            f"{doc['extra_us'][case]:+.1f} |")
    lines += ["", f"Per message, write and read: **{doc['extra_total_us']:+.1f} µs** of CPU; "
              f"payload {doc['payload_bytes']['clear']:,.0f} → "
              f"{doc['payload_bytes']['sealed']:,.0f} bytes "
              f"({doc['extra_bytes']:+,.0f})."]
    return "\n".join(lines) + "\n"


def envelope_plot(doc: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from notiflow.bench.report import palette

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    xs = range(len(CASES))
    width = 0.38
    for offset, mode, colour in ((-width / 2, "clear", "#8da0cb"),
                                 (width / 2, "sealed", "#fc8d62")):
        values = [doc["median_us"][mode][c] for c in CASES]
        errors = [[v - doc["spread_us"][mode][c][0] for v, c in zip(values, CASES,
                                                                     strict=True)],
                  [doc["spread_us"][mode][c][1] - v for v, c in zip(values, CASES,
                                                                     strict=True)]]
        ax.bar([x + offset for x in xs], values, width, yerr=errors, label=mode, color=colour,
               capsize=3)
    ax.set_xticks(list(xs), ["write payload", "read payload"])
    ax.set_ylabel("µs CPU per message")
    ax.set_title(f"Ingest envelope: {doc['extra_total_us']:+.1f} µs per message, "
                 f"{doc['extra_bytes']:+.0f} bytes")
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return palette(png, path)
