"""The report of ``notiflow bench scheduler``: its Markdown table and its figure (lateness
p99 per 10 s of due time, the scheduler's RSS over the load phase)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def scheduler_markdown(doc: dict[str, Any]) -> str:
    f, ld = doc["failover"], doc["load"]
    rss = ld.get("scheduler_rss_mb") or [None, None, None]
    return "\n".join([
        "# Scheduler benchmark", "",
        f"Failover: {f['n']:,} rows due over {f['window_s']:.0f} s, two schedulers, one "
        "SIGKILLed halfway.", "",
        "| published | lost | early | copies | lateness p50 | p99 | max |",
        "|---|---|---|---|---|---|---|",
        f"| {f['published']:,} | {f['lost']} | {f['early']} | {f['copies']} | "
        f"{f['lateness_p50_s']} s | {f['lateness_p99_s']} s | {f['lateness_max_s']} s |", "",
        f"Load: {ld['n']:,} rows due at {ld['rate']:,.0f}/s, one scheduler (rows written "
        f"ahead of time in {ld['write_s']} s).", "",
        "| published | lost | published/s | lateness p50 | p99 | max | scheduler CPU ms/row |"
        " scheduler RSS MB (start, end, max) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {ld['published']:,} | {ld['lost']} | {ld['published_per_s']:,} | "
        f"{ld['lateness_p50_s']} s | {ld['lateness_p99_s']} s | {ld['lateness_max_s']} s | "
        f"{ld['scheduler_cpu_ms_per_row']} | {rss[0]}, {rss[1]}, {rss[2]} |", ""])


def scheduler_plot(doc: dict[str, Any], path: Path) -> Path:
    """Lateness p99 per 10 s of due time, and the scheduler's RSS, over the load phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ld = doc["load"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    pts = ld.get("slices") or []
    a.plot([x["t_s"] for x in pts], [x["p99_s"] for x in pts], color="tab:blue")
    a.set_xlabel("due time (s from first row)")
    a.set_ylabel("lateness p99 (s)")
    a.set_title(f"{ld['n']:,} rows due at {ld['rate']:,.0f}/s")
    tenths = ((ld.get("procs") or {}).get("scheduler") or {}).get("rss_tenths_mb") or []
    b.plot([i * 10 for i in range(len(tenths))], tenths, marker="o", color="tab:green")
    b.set_xlabel("share of the run (%)")
    b.set_ylabel("scheduler RSS (MiB)")
    b.set_ylim(bottom=0)
    b.set_title("scheduler memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
