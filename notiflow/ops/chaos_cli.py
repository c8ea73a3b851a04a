"""``notiflow chaos``: the fault scenarios of ``ops/chaos.py`` from the command line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console()


def chaos_command(
    scenarios: Annotated[list[str] | None, typer.Argument(
        help="Scenarios to run (see --list); none: all of them.")] = None,
    list_only: Annotated[bool, typer.Option("--list", help="List the scenarios.")] = False,
    messages: Annotated[int, typer.Option(help="P1 messages per scenario.")] = 1000,
    rate: Annotated[float, typer.Option(help="P1 submissions per second.")] = 50.0,
    p0_rate: Annotated[float, typer.Option(help="P0 OTPs per second beside them.")] = 5.0,
    seed: Annotated[int, typer.Option(help="Chooses each fault's moment.")] = 1,
    out: Annotated[Path, typer.Option(help="Where logs, JSON and Markdown go.")] = Path(
        "bench/results/chaos"),
    short: Annotated[bool, typer.Option(
        help="hostile-tenant: the test command's size (a few hundred messages).")] = False,
    runs: Annotated[int, typer.Option(help="hostile-tenant: runs one after another.")] = 1,
) -> None:
    """Fault injection against the running local stack: per scenario, accepted, terminal,
    lost, duplicate provider sends, status regressions, P0 p99 during the fault and the time
    to recover (docs/reliability.md). Exits 1 when a message or a status webhook was lost, or a
    status regressed. ``hostile-tenant`` (run alone; its own sizes, ``--short``, ``--runs``):
    tenant B's P0/P1 traffic while tenant A attacks; exits 1 on any violation."""
    from notiflow.ops.chaos import SCENARIOS, run_scenario, table, totals

    if list_only:
        for s in SCENARIOS.values():
            console.print(f"{s.name:18} {s.what} (held {s.hold:g} s)", highlight=False)
        console.print(f"{HOSTILE:18} tenant B's P0/P1 traffic while tenant A attacks at once",
                      highlight=False)
        return
    if scenarios == [HOSTILE]:
        raise typer.Exit(hostile_tenant(out, short=short, runs=runs))
    unknown = [n for n in scenarios or [] if n not in SCENARIOS]
    if unknown:
        console.print(f"[red]unknown scenarios:[/red] {', '.join(unknown)} (see --list)")
        raise typer.Exit(2)
    chosen = [SCENARIOS[n] for n in scenarios] if scenarios else list(SCENARIOS.values())
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    reports = []
    for i, scenario in enumerate(chosen):
        report = run_scenario(scenario, out, messages=messages, rate=rate, p0_rate=p0_rate,
                              seed=seed + i, log=lambda m: console.print(m, highlight=False))
        reports.append(report)
        print(table([report]), flush=True)
    (out / f"chaos-{stamp}.json").write_text(json.dumps([r.as_dict() for r in reports],
                                                        indent=2) + "\n")
    (out / f"chaos-{stamp}.md").write_text(table(reports))
    print(table(reports))
    bad = totals(reports)
    raise typer.Exit(1 if bad["lost"] or bad["regressions"] or bad["lost_webhooks"] else 0)


HOSTILE = "hostile-tenant"


def hostile_tenant(out: Path, *, short: bool, runs: int) -> int:
    """Run ``notiflow chaos hostile-tenant`` ``runs`` times; writes JSON and Markdown; 1 when
    a run broke a promise (each printed)."""
    from notiflow.ops.chaos_hostile import SHORT, Config, markdown, run

    config = SHORT if short else Config()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    reports = []
    for _ in range(runs):
        report = run(out, config, log=lambda m: console.print(m, highlight=False))
        reports.append(report)
        (out / f"hostile-{stamp}.json").write_text(json.dumps(
            [r.as_dict() for r in reports], indent=2) + "\n")
        (out / f"hostile-{stamp}.md").write_text(markdown(reports))
        for line in report.violations():
            console.print(f"[red]violation:[/red] {line}", highlight=False)
    print(markdown(reports))
    return 1 if any(r.violations() for r in reports) else 0
