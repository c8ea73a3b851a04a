"""The report of ``notiflow bench api``: the acceptance targets, each mode's maximum, every
step's figures (Markdown), and latency and accepted rate against the offered rate (PNG)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from notiflow.bench.openloop import OUTSIDE
from notiflow.bench.proc_cpu import QUIET_MARGIN

STACK = ("cassandra", "kafka", "redis")
LABELS = {"ceiling": "ceiling (1 Cassandra write + 1 Kafka produce)",
          "batch-ceiling": "batch ceiling (1 row each in unlogged batches + 1 produce each)",
          "single-p0": "single P0 (priority lane)", "single-p3": "single P3 (bulk lane)",
          "user-p3": "single P3 to a user (bulk lane, resolved to SMS)",
          "batch-p3": "batch P3 (bulk lane)", "p0-half": "P0 at half its maximum"}
COLORS = {"ceiling": "tab:gray", "batch-ceiling": "tab:brown", "single-p0": "tab:blue",
          "single-p3": "tab:orange", "user-p3": "tab:red",
          "batch-p3": "tab:green", "p0-half": "tab:purple"}


def platform_ms(cpu: Mapping[str, float | None]) -> float | None:
    """CPU ms per message of every process but the generator (``bench``)."""
    values = [v for k, v in cpu.items() if k != "bench" and v is not None]
    return round(sum(values), 2) if values else None


def _v(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}{unit}" if v < 100 else f"{v:,.0f}{unit}"
    return f"{v:,}{unit}"


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _targets(t: Mapping[str, Any]) -> list[str]:
    half = t.get("p0_half_rate")
    open_ended = [m for m, hit in (t.get("saturated") or {}).items() if not hit]
    note = ([f"Not saturated (every rate ran; the maximum is a lower bound): "
             f"{', '.join(open_ended)}.", ""] if open_ended else [])
    return ["## Targets", "", "| target | measured | goal |", "|---|---|---|",
            f"| single P0 accepted/s ÷ ceiling | {_share(t.get('single_p0_over_ceiling'))} "
            "| ≥ 50 % |",
            f"| single P3 accepted/s ÷ ceiling | {_share(t.get('single_p3_over_ceiling'))} "
            "| ≥ 50 % |",
            f"| batch P3 ÷ single P3, messages/s | {_v(t.get('batch_over_single_p3'), 'x')} "
            "| ≥ 10x |",
            f"| P3 to a user ÷ to an address, messages/s | "
            f"{_share(t.get('user_over_single_p3'))} | reported |",
            f"| P3 to a user ÷ to an address, bulk API CPU ms per message at each maximum | "
            f"{_v(t.get('user_cpu_over_single_p3'), 'x')} | reported |",
            f"| P0 p99 at half its maximum ({_v(half, '/s')}) | "
            f"{_v(t.get('p0_half_p99_ms'), ' ms')} | ≤ 50 ms |",
            f"| batch P3 ÷ batch ceiling, messages/s | "
            f"{_share(t.get('batch_over_batch_ceiling'))} | reported |",
            f"| batch ceiling ÷ single P3 (the most batch ÷ single could reach here) | "
            f"{_v(t.get('batch_ceiling_over_single_p3'), 'x')} | reported |", "", *note]


def _cpu_cells(s: Mapping[str, Any], server: str) -> str:
    cpu = s.get("cpu_ms_per_msg") or {}
    cells = [cpu.get(server), *(cpu.get(n) for n in STACK), platform_ms(cpu), cpu.get("bench")]
    return " | ".join("-" if c is None else f"{c:.2f}" for c in cells)


def api_markdown(doc: dict[str, Any]) -> str:
    plan = doc["plan"]
    modes = doc["modes"]
    out = ["# Acceptance benchmark (open loop)", "",
           f"Steps of {plan['warmup_s']} s unmeasured + {plan['duration_s']} s measured at "
           f"fixed offered rates, each {plan['factor']} times the one before, until a step "
           f"accepts under {plan['min_share']:.0%} of what it offers or its p99 passes "
           f"{plan['p99_bound_ms']:,.0f} ms (at most {plan['steps']} steps); batches of "
           f"{plan['batch_size']} messages. Latency is from each request's intended send "
           "time to its answer (failures included); a mode's maximum is its best accepted/s. "
           "CPU: ms per accepted message, from the first measured request to the last "
           "answer (an API process with its worker processes).", "",
           f"API processes per lane: {doc.get('api_processes', 1)} (`notiflow api "
           "--processes`).", "", *_targets(doc.get("targets") or {}),
           "## Modes", "",
           "| mode | max accepted/s | stopped | at the max step: offered/s | p50 ms | p99 ms "
           "| CPU ms/msg: server | Cassandra | Kafka | Redis | platform | generator |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in modes.items():
        top = max(m["steps"], key=lambda s: s["accepted_per_s"]) if m["steps"] else None
        stopped = m["stop"] or ("one step" if name == "p0-half" else "no: every rate ran")
        if top is None:
            out.append(f"| {LABELS.get(name, name)} | - | {stopped} | - | - | - | "
                       + " | ".join(["-"] * 6) + " |")
            continue
        out.append(f"| {LABELS.get(name, name)} | {_v(m['max_per_s'])} | {stopped} | "
                   f"{_v(top['offered_per_s'])} | {_v(top['p50_ms'])} | {_v(top['p99_ms'])} "
                   f"| {_cpu_cells(top, m['server'])} |")
    out += ["", "## Steps", "",
            "| mode | offered/s | accepted/s | p50 ms | p99 ms | max ms | not accepted "
            "| waited for the cap | generator lag p99 ms | CPU ms/msg: server | Cassandra "
            "| Kafka | Redis | platform | generator |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in modes.items():
        for s in m["steps"]:
            refused = ", ".join(f"{k}: {v:,}" for k, v in s["refused"].items()) or "-"
            out.append(f"| {name} | {_v(s['offered_per_s'])} | {_v(s['accepted_per_s'])} | "
                       f"{_v(s['p50_ms'])} | {_v(s['p99_ms'])} | {_v(s['max_ms'])} | "
                       f"{refused} | {s['capped']} | {_v(s['lag_p99_ms'])} | "
                       f"{_cpu_cells(s, m['server'])} |")
    out += _slowest(modes)
    quiet = (modes.get("p0-half") or {}).get("quiet")
    if quiet:
        out += ["", _quiet_note(quiet)]
    rest = doc.get("at_rest") or {}
    if rest:
        out += ["", "At rest before the load (share of one core): " + ", ".join(
            f"{n} {v:.3f}" for n, v in rest.items()) + "."]
    procs = doc.get("processes") or {}
    if procs:
        sched = ", ".join(f"{n} nice {p.get('nice', '-')}"
                          + (" (real-time)" if p.get("realtime") else "")
                          for n, p in procs.items())
        out += ["", f"Processes: {sched}. Server: the process the mode loads (`api`: "
                "priority lane, `api-bulk`: bulk lane, `ceiling`); platform: every process "
                "but the generator."]
    return "\n".join([*out, ""])


def _slowest(modes: Mapping[str, Any]) -> list[str]:
    """Where the slowest 1 % of each single mode's steps waited (median ms per stage of the
    server's ``Server-Timing``; ``outside``: the rest of the latency)."""
    rows = [(name, s) for name, m in modes.items() for s in m["steps"] if s.get("slowest")]
    if not rows:
        return []
    stages = [*sorted({n for _, s in rows for n in s["slowest"]} - {OUTSIDE}), OUTSIDE]
    out = ["", "## Where the slowest 1 % waited", "",
           "Median ms, over the requests at or above a step's p99, of each stage of the "
           "server's own `Server-Timing` (`api.accept` spans admission, template, reserve "
           "and write); `outside`: the latency minus `api.accept` and `api.kafka_ack` "
           "(the HTTP server, the event loop, parsing and validation before acceptance, "
           "the network and the generator).", "",
           "| mode | offered/s | p99 ms | " + " | ".join(stages) + " |",
           "|---|---|---|" + "---|" * len(stages)]
    for name, s in rows:
        cells = " | ".join(_v(s["slowest"].get(n)) for n in stages)
        out.append(f"| {name} | {_v(s['offered_per_s'])} | {_v(s['p99_ms'])} | {cells} |")
    return out


def _quiet_note(quiet: Mapping[str, Any]) -> str:
    """The wait before ``p0-half`` for Cassandra and Kafka to be near their CPU at rest and
    Cassandra's compactions and flushes to finish."""
    cpu = ", ".join(f"{n} {v:.2f}" for n, v in (quiet.get("cpu") or {}).items()) or "-"
    busy = "; ".join(quiet.get("busy") or [])
    how = (f"timed out: the stack was still busy{f' ({busy})' if busy else ''}"
           if quiet.get("timed_out")
           else f"then within {QUIET_MARGIN} core of its share at rest, no Cassandra "
                "compaction or flush under way")
    return (f"Before P0 at half its maximum: waited {quiet['waited_s']:.0f} s for the stack "
            f"to be quiet ({how}; share of one core over the last second: {cpu}).")


def api_plot(doc: dict[str, Any], path: Path) -> Path:
    """Left: p50 (solid) and p99 (dotted) latency against the offered rate per mode (log);
    right: accepted against offered messages/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    from notiflow.bench.report import palette

    fig, (lat, acc) = plt.subplots(1, 2, figsize=(13, 4.8))
    top = 1.0
    for name, m in doc["modes"].items():
        steps = m["steps"]
        if not steps:
            continue
        color = COLORS.get(name, "black")
        x = [s["offered_per_s"] for s in steps]
        top = max(top, *x, *(s["accepted_per_s"] for s in steps))
        marker = "o" if len(steps) > 1 else "D"
        lat.plot(x, [max(s["p50_ms"] or 0.1, 0.1) for s in steps], color=color, marker=marker,
                 label=LABELS.get(name, name))
        lat.plot(x, [max(s["p99_ms"] or 0.1, 0.1) for s in steps], color=color, marker=marker,
                 linestyle=":")
        acc.plot(x, [s["accepted_per_s"] for s in steps], color=color, marker=marker,
                 label=LABELS.get(name, name))
    lat.axhline(50, color="tab:red", linestyle="--", linewidth=1, label="P0 target at half "
                "max: p99 50 ms")
    acc.plot([1, top], [1, top], color="black", linewidth=0.8, linestyle="--",
             label="accepted = offered")
    _log_axes(lat, "latency from intended send, ms (p50 solid, p99 dotted)")
    _log_axes(acc, "accepted messages/s")
    for axis in (lat.xaxis, acc.xaxis, acc.yaxis):
        axis.set_major_formatter(ScalarFormatter())
        axis.set_minor_formatter(NullFormatter())
    fig.suptitle("notiflow bench api: open-loop acceptance")
    fig.tight_layout()
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=110)
    plt.close(fig)
    return palette(rgba, path)


def _log_axes(ax: Any, ylabel: str) -> None:
    """Log-log axes against offered messages/s, with a grid and a legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered messages/s")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
