"""Benchmark results as files a person reads: ``<name>.json``, ``<name>.md`` (Markdown tables)
and, for the isolation run, ``isolation.png`` (latency over time per mode); :func:`publish`
writes the three from a run's summary (:mod:`notiflow.bench.summary`) for ``bench/figures/``."""

from __future__ import annotations

import io
import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from notiflow.bench.api_report import api_markdown, api_plot
from notiflow.bench.campaign_report import campaign_markdown, campaign_plot
from notiflow.bench.scheduler_report import scheduler_markdown, scheduler_plot
from notiflow.bench.summary import LATENCY_COLUMNS, dumps, latency_of, pressure_of, summarize


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {"cpus": psutil.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30),
            "python": platform.python_version(), "system": platform.platform(terse=True)}


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.1f} s" if v >= 10_000 else f"{v:.0f} ms"


def _num(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:,.0f}{unit}"


def isolation_markdown(doc: dict[str, Any]) -> str:
    rows = ["| mode | P0 sent | P0 p50 | P0 p99 | P0 max | P3 n | P3 p50 | P3 p99 | P3 max "
            "| P3 drain | campaign produced at | drained |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, r in doc["modes"].items():
        p0, p3 = r["p0"], r["p3"]
        rows.append(f"| {mode} | {p0['sent']} ({p0['missing']} missing) | {_ms(p0['p50'])} | "
                    f"{_ms(p0['p99'])} | {_ms(p0['max'])} | {p3['n']} ({p3['missing']} "
                    f"missing) | {_ms(p3['p50'])} | {_ms(p3['p99'])} | {_ms(p3['max'])} | "
                    f"{_num(p3['drain_rate'], '/s')} over {p3['drain_s']} s | "
                    f"{_num(r['produce_rate'], '/s')} | {r['drained']} |")
    out = ["## Isolation: P0 OTPs during a P3 campaign flood", "", *rows, ""]
    if "p0_p99_ratio_shared_over_tiered" in doc:
        out.append(f"P0 p99, shared ÷ tier-isolated: **{doc['p0_p99_ratio_shared_over_tiered']}"
                   "x** (same run).")
        out.append("")
    out += _budget_tables(doc["modes"])
    out += _process_table({m: r["processes"] for m, r in doc["modes"].items()})
    return "\n".join(out)


def _budget_tables(modes: dict[str, Any]) -> list[str]:
    """The latency budget per stage (``notiflow.stage.duration``) and the P0 stall intervals."""
    out: list[str] = []
    for mode, r in modes.items():
        if r.get("budget_recorded") is False:
            out += [f"Latency budget, {mode}: not recorded (`--no-budget`: the processes "
                    "exported no metrics).", ""]
        for tier, stages in (r.get("budget") or {}).items():
            if not stages:
                continue
            out += [f"### Latency budget, {mode}, {tier} (ms per stage; p50/p99 from the "
                    "histogram's buckets, max exact)", "",
                    "| stage | count | mean | p50 | p99 | max |", "|---|---|---|---|---|---|"]
            out += [f"| {name} | {b['count']} | {b['mean_ms']} | {b['p50_ms']} | "
                    f"{b['p99_ms']} | {b['max_ms']} |" for name, b in stages.items()]
            out.append("")
        for name, j in (r.get("jvm_pauses") or {}).items():
            long = ", ".join(f"{t:.0f} s {ms:.0f} ms" for t, ms, _ in j["long"][:20])
            out += [f"{name} JVM, {mode}: {j['pauses']} safepoint pauses, {j['total_ms']} ms in "
                    f"all, longest {j['max_ms']} ms" + (f"; above 50 ms at {long}" if long
                                                      else ""), ""]
        out += _host_lines(mode, r.get("host") or {})
        for service, g in sorted((r.get("gc_pauses") or {}).items()):
            long = ", ".join(f"{t:.0f} s {ms:.0f} ms" for t, ms in g["long"][:12])
            out += [f"Python GC, {service} ({mode}): {g['collections']} collections, "
                    f"{g['total_ms']} ms in all, longest {g['max_ms']} ms"
                    + (f"; over 50 ms at {long}" if long else ""), ""]
        bw = r.get("bulk_window") or {}
        if bw.get("samples"):
            out += [f"Bulk window ({mode}): below full in {bw['share_yielding']:.0%} of "
                    f"{bw['samples']} samples, smallest {bw['min']:.0%} of the ceiling, mean "
                    f"{bw['mean']:.0%}.", ""]
        slow = r.get("stalls") or []
        if slow:
            shown = ", ".join(f"{t:.0f} s {stage} {ms:.0f} ms" for t, stage, ms in slow[:40])
            more = f" (+{len(slow) - 40} more)" if len(slow) > 40 else ""
            out += [f"P0 stages above 250 ms, {mode} (second of the run, stage, max): "
                    f"{shown}{more}", ""]
    return out


def _host_lines(mode: str, machine: dict[str, Any]) -> list[str]:
    """The machine's pressure over the run and in P0's stall intervals."""
    h = machine.get("summary") or {}
    if not h.get("samples"):
        return []
    speed = machine.get("speed") or {}
    pace = "".join(f", {when} the load {speed[when]['per_cpu_s']:,} rounds per CPU second "
                   f"({speed[when]['per_wall_s']:,} per wall second)"
                   for when in ("before", "after") if when in speed)
    out = ([f"Machine speed ({mode}; notiflow/bench/calibrate.py, one thread){pace}.", ""]
           if pace else [])
    out += [f"Machine ({mode}): tasks waiting on I/O {h['io_some_s']} s (all tasks at once "
           f"{h['io_full_s']} s; worst second {h['worst_io_some'][1]:.0f} ms at "
           f"{h['worst_io_some'][0]:.0f} s), waiting for a core {h['cpu_some_s']} s (worst "
           f"second {h['worst_cpu_some'][1]:.0f} ms at {h['worst_cpu_some'][0]:.0f} s); "
           f"{h['written_mb']:,.0f} MB written; dirty page cache at most "
           f"{h['max_dirty_mb'][1]:,.0f} MB, under writeback at most "
           f"{h['max_writeback_mb'][1]:,.0f} MB.", ""]
    at = machine.get("at_stalls") or []
    if at:
        shown = "; ".join(f"{a['t']:.0f} s: I/O {a['io_some_ms']:.0f}/{a['io_full_ms']:.0f} ms, "
                          f"core {a['cpu_some_ms']:.0f} ms, dirty {a['dirty_mb']:.0f} MB, "
                          f"writing {a['write_busy_ms']:.0f} ms, reading "
                          f"{a.get('read_busy_ms', 0):.0f} ms{_held(a.get('blocked'))}"
                          for a in at[:20])
        out += [f"Machine while P0 stalled ({mode}; per stall interval, its most pressured "
                f"second: pressure ms some/full, dirty page cache, ms the disks spent writing "
                f"and reading, threads seen waiting in uninterruptible sleep): {shown}", ""]
    held = machine.get("blocked") or []
    if held:
        shown = ", ".join(f"{who} x{n} ({first:.0f}-{last:.0f} s)"
                          for who, n, first, last in held)
        out += [f"Threads waiting in uninterruptible sleep ({mode}; scanned every 0.1 s in "
                f"which the machine's I/O pressure grew; process/thread kernel function x "
                f"scans): {shown}", ""]
    return out


def _held(blocked: list[list[Any]] | None) -> str:
    return (" [" + ", ".join(f"{who} x{n}" for who, n in blocked) + "]") if blocked else ""


def soak_markdown(doc: dict[str, Any]) -> str:
    r = doc["modes"]["soak"]
    rows = ["| process | RSS at load start MiB | at half time | at end | growth, 2nd half | "
            "max MiB | CPU s |", "|---|---|---|---|---|---|---|"]
    for name, p in r["processes"].items():
        mid = p.get("rss_mid_mb", p["rss_start_mb"])
        rows.append(f"| {name} | {p['rss_start_mb']} | {mid} | {p['rss_end_mb']} | "
                    f"{p['rss_end_mb'] - mid:+.1f} | {p['rss_max_mb']} | {p['cpu_s']} |")
    series = ["| process | RSS MiB at each tenth of the load (0 % … 100 %) |", "|---|---|"]
    series += [f"| {name} | {' '.join(str(v) for v in p['rss_tenths_mb'])} |"
               for name, p in r["processes"].items() if p.get("rss_tenths_mb")]
    p0, p3 = r["p0"], r["p3"]
    return "\n".join([
        f"## Soak: {doc['minutes']} minutes, P3 at {doc['p3_rate']}/s and P0 at "
        f"{r['otp_rate']}/s (tier-isolated); recipient caps counted over "
        f"{doc.get('cap_window_s', 'their production')} s windows", "",
        f"P0: {p0['n']} sent, p50 {_ms(p0['p50'])}, p99 {_ms(p0['p99'])}, max {_ms(p0['max'])};"
        f" P3: {p3['n']} of {r['n']}, p50 {_ms(p3['p50'])}, p99 {_ms(p3['p99'])}.", "",
        *rows, "", *series, "", *_budget_tables({"soak": r})])


def _process_table(by_phase: dict[str, dict[str, Any]]) -> list[str]:
    rows = ["| phase | process | CPU s | RSS start MiB | RSS end MiB | RSS max MiB |",
            "|---|---|---|---|---|---|"]
    for phase, procs in by_phase.items():
        for name, p in procs.items():
            rows.append(f"| {phase} | {name} | {p['cpu_s']} | {p['rss_start_mb']} | "
                        f"{p['rss_end_mb']} | {p['rss_max_mb']} |")
    return ["### Processes", "", *rows, ""]


def _pressure_panel(ax: Any, pressure: dict[str, Any]) -> None:
    """The machine's pressure stall time per second under a mode's latency panel."""
    columns = pressure["columns"]
    rows = pressure["rows"]
    t = [row[0] for row in rows]
    for key, color, label in (("cpu_some_ms", "tab:green", "waiting for a core (some)"),
                              ("io_some_ms", "tab:purple", "waiting on I/O (some)"),
                              ("io_full_ms", "tab:red", "waiting on I/O (full)")):
        i = columns.index(key)
        ax.plot(t, [row[i] for row in rows], color=color, linewidth=0.7, label=label)
    ax.set_ylabel("pressure, ms per second")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")


def throughput_markdown(doc: dict[str, Any]) -> str:
    e2e, minimal, passthrough = doc["e2e"], doc["minimal"], doc["passthrough"]
    rows = [
        "| pipeline | messages | rate (msg/s) | steady rate | CPU ms/msg |",
        "|---|---|---|---|---|",
        f"| notiflow P2 end to end (ingest → provider → status in Cassandra) | {e2e['n']} | "
        f"{_num(e2e['rate'])} | {_num(e2e['steady_rate'])} | {e2e['cpu_ms_per_msg']} |",
        f"| (a) minimal pipeline (one provider request + one status write) | {minimal['n']} | "
        f"{_num(minimal['rate'])} | {_num(minimal.get('steady_rate'))} | "
        f"{minimal['cpu_ms_per_msg']} |",
        f"| (b) confluent-kafka consume → produce passthrough | {passthrough['n']} | "
        f"{_num(passthrough['rate'])} | - | {passthrough['cpu_ms_per_msg']} |",
    ]
    out = ["## Throughput: P2 end to end against the I/O ceiling", "", *rows, "",
           f"End to end ÷ minimal pipeline: **{doc['ratio_minimal']:.0%}**; "
           f"÷ passthrough: **{doc['ratio_passthrough']:.1%}** (same run"
           + _warm_text(doc) + ").", ""]
    jit = [f"{label} {_jit_text(r)}" for label, r in (("end to end", e2e),
                                                       ("minimal pipeline", minimal))
           if r.get("jit_ms_per_msg")]
    if jit:
        out += ["JIT compilers of the stack's JVMs during each measured phase (CPU ms per "
                "message, share of those JVMs' CPU): " + "; ".join(jit) + ".", ""]
    for label, r in (("end to end", e2e), ("minimal pipeline", minimal),
                     ("passthrough", passthrough)):
        cpu = r.get("cpu_by_process", {})
        if cpu:
            out += [f"CPU ms per message by process ({label}): " + ", ".join(
                f"{k} {v}" for k, v in cpu.items()), ""]
    machine = [f"{label} {r['machine_cpu_ms_per_msg']} ms of CPU per message, "
               f"{r['machine_idle_share']:.0%} of the cores idle"
               for label, r in (("end to end", e2e), ("minimal pipeline", minimal))
               if r.get("machine_cpu_ms_per_msg") is not None]
    if machine:
        out += ["The whole machine during each measured phase (every process and the "
                "kernel, `/proc/stat`): " + "; ".join(machine) + ".", ""]
    for proc, prof in doc.get("profile", {}).items():
        samples = int(prof["samples"][0][1]) if prof["samples"] else 0
        out += [f"### Profile of {proc} (py-spy, {samples} samples)",
                "", "| top stages (inclusive) | share | top functions (self) | share |",
                "|---|---|---|---|"]
        for i in range(max(len(prof["stages"]), len(prof["self"]))):
            st = prof["stages"][i] if i < len(prof["stages"]) else ("", 0)
            se = prof["self"][i] if i < len(prof["self"]) else ("", 0)
            out.append(f"| `{st[0]}` | {st[1]:.0%} | `{se[0]}` | {se[1]:.0%} |")
        out.append("")
    out += _process_table({"e2e": e2e["procs"]})
    return "\n".join(out)


def _warm_text(doc: dict[str, Any]) -> str:
    """How the run warmed the JVMs before measuring (older runs: one round per pipeline)."""
    if not doc.get("warmup"):
        return ""
    rounds = doc.get("warmup_rounds")
    if rounds is None:
        return f", after {doc['warmup']} messages through each pipeline to warm the JVMs"
    shares = ", ".join("-" if r["jit_share"] is None else f"{r['jit_share']:.0%}"
                       for r in rounds)
    return (f", after {len(rounds)} warm-up round(s) of {doc['warmup']} messages through "
            f"each pipeline, the JIT compilers' share of the JVMs' CPU in each: {shares}")


def _jit_text(r: dict[str, Any]) -> str:
    per = ", ".join(f"{k} {v:.2f}" for k, v in r["jit_ms_per_msg"].items())
    share = r.get("jit_share")
    return f"{per} ({'-' if share is None else f'{share:.0%}'})"


def scale_markdown(doc: dict[str, Any]) -> str:
    rows = ["| processes | provider-accepted rate (msg/s) | status-written rate (msg/s) | "
            "speed-up | CPU ms/msg (send) |", "|---|---|---|---|---|"]
    base = None
    for r in doc["runs"]:
        base = base or r["steady_rate"]
        speed = (r["steady_rate"] / base) if base and r["steady_rate"] else None
        rows.append(f"| {r['processes']} | {_num(r['steady_rate'])} | {_num(r['rate'])} | "
                    f"{'-' if speed is None else f'{speed:.2f}x'} | {r['cpu_ms_per_msg']} |")
    return "\n".join(["## Scale: one tier's send flow on 1, 2, 4 Bytewax processes", "",
                      *rows, ""])


MARKDOWN: dict[str, Callable[[dict[str, Any]], str]] = {
    "isolation": isolation_markdown, "soak": soak_markdown,
    "throughput": throughput_markdown, "scale": scale_markdown,
    "scheduler": scheduler_markdown, "campaign": campaign_markdown, "api": api_markdown}
"""The Markdown report of each ``bench`` kind."""


def markdown(doc: dict[str, Any]) -> str:
    """The ``.md`` file's text for a document with its ``bench`` and ``machine`` fields."""
    text = MARKDOWN[doc["bench"]](doc)
    return text + f"\nMachine: {doc['machine']}\n" if "machine" in doc else text


def write(out: Path, name: str, doc: dict[str, Any], markdown: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "machine": machine()}
    js = out / f"{name}.json"
    js.write_text(json.dumps(doc, indent=1, default=str))
    md = out / f"{name}.md"
    md.write_text(markdown + f"\nMachine: {doc['machine']}\n")
    return [js, md]


def publish(doc: dict[str, Any], base: Path) -> list[Path]:
    """A run as ``bench/figures/`` keeps it: ``<base>.json`` (:func:`summarize` of ``doc``),
    ``<base>.md`` and, for an isolation, scheduler, campaign or api run, ``<base>.png``, all
    rendered from the summary."""
    brief = summarize(doc)
    base.parent.mkdir(parents=True, exist_ok=True)
    js, md = base.with_name(base.name + ".json"), base.with_name(base.name + ".md")
    js.write_text(dumps(brief))
    md.write_text(markdown(brief))
    paths = [js, md]
    if brief["bench"] == "isolation":
        paths.append(isolation_plot(brief, base.with_name(base.name + ".png")))
    elif brief["bench"] == "scheduler":
        paths.append(scheduler_plot(brief, base.with_name(base.name + ".png")))
    elif brief["bench"] == "campaign":
        paths.append(campaign_plot(brief, base.with_name(base.name + ".png")))
    elif brief["bench"] == "api":
        paths.append(api_plot(brief, base.with_name(base.name + ".png")))
    return paths


def isolation_plot(doc: dict[str, Any], path: Path) -> Path:
    """Latency (acceptance → provider acceptance) over time, one panel per mode: per window,
    P0's and P3's p50 and p99 and their range; below, the machine's pressure when recorded.
    Drawn from :func:`latency_of` and :func:`pressure_of`, so a run's full JSON and its
    summary give the same PNG (a 256-colour palette, a third of the RGBA file's size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(doc["modes"].items())
    pressures = [pressure_of(r) for _, r in modes]
    rows = 2 if any(p and p["rows"] for p in pressures) else 1
    fig, axes = plt.subplots(rows, len(modes), figsize=(6.5 * len(modes), 4.5 + 2.5 * (rows - 1)),
                             squeeze=False, sharex="col",
                             gridspec_kw={"height_ratios": [3, 1.6][:rows]})
    for other in axes[0][1:]:
        other.sharey(axes[0][0])
    for col, (mode, r) in enumerate(modes):
        ax = axes[0][col]
        _latency_panel(ax, r)
        window = (r.get("bulk_window") or {}).get("timeline") or []
        if window:
            share = ax.twinx()
            share.step([t for t, _ in window], [v for _, v in window], where="post",
                       color="tab:gray", linewidth=0.8, alpha=0.7)
            share.set_ylim(0, 1.05)
            share.set_ylabel("bulk in-flight window (share of its ceiling, gray)")
        pressure = pressures[col]
        if rows == 2 and pressure:
            _pressure_panel(axes[1][col], pressure)
        ax.set_title(f"{mode}: P0 p99 {_ms(r['p0']['p99'])}, P3 drained in "
                     f"{r['p3']['drain_s']} s")
        axes[-1][col].set_xlabel("seconds since the flood started (emulator receipt time)")
    axes[0][0].set_ylabel("acceptance → provider acceptance (ms, log)")
    fig.tight_layout()
    rgba = io.BytesIO()
    fig.savefig(rgba, format="png", dpi=110)
    plt.close(fig)
    palette(rgba, path)
    return path


def _latency_panel(ax: Any, r: dict[str, Any]) -> None:
    """Per tier and window: the p50 (solid) and p99 (dotted) latency over the min-max band."""
    latency = latency_of(r) or {"window_s": 1, "columns": list(LATENCY_COLUMNS), "tiers": {}}
    col = {name: i for i, name in enumerate(latency["columns"])}
    for tier, color in (("p3", "tab:orange"), ("p0", "tab:blue")):
        rows = latency["tiers"].get(tier) or []
        if not rows:
            continue
        t = [row[col["t"]] for row in rows]
        lo, p50, p99, hi = ([max(row[col[k]], 1.0) for row in rows]
                            for k in ("min", "p50", "p99", "max"))
        ax.fill_between(t, lo, hi, step="post", color=color, alpha=0.25, linewidth=0)
        ax.step(t, p50, where="post", color=color, linewidth=1.2,
                label=f"{tier.upper()} (n={r[tier]['n']})")
        ax.step(t, p99, where="post", color=color, linewidth=0.8, linestyle=":")
    ax.axhline(1000, color="tab:red", linestyle="--", linewidth=1, label="P0 SLA 1 s")
    ax.text(0.99, 0.01, f"per {latency['window_s']} s: p50 solid, p99 dotted, min-max shaded",
            transform=ax.transAxes, ha="right", va="bottom", fontsize="small", color="dimgray")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")


def palette(png: io.BytesIO | Path, path: Path) -> Path:
    """``png`` rewritten to ``path`` with a 256-colour palette (no dithering): a chart's few
    colours and their antialiasing survive, the file shrinks to about a third."""
    from PIL import Image

    with Image.open(png) as image:
        quantized = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT,
                                                  dither=Image.Dither.NONE)
    quantized.save(path, format="PNG", optimize=True)
    return path
