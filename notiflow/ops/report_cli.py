"""``notiflow report``: the archive's delivery analytics as tables, JSON and PNG plots
(queries and plots: ``notiflow/ops/report.py``)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from notiflow.ops import report
from notiflow.ops.archive_cli import manifests
from notiflow.settings import Settings, load_settings

console = Console()


def _day(text: str | None, default: date, option: str) -> date:
    if text is None:
        return default
    try:
        return date.fromisoformat(text)
    except ValueError as exc:
        console.print(f"[red]{option}:[/red] {exc}")
        raise typer.Exit(2) from None


async def build(settings: Settings, since: date, until: date, tenants: list[str] | None,
                root: Path, engine: str = "chdb",
                ) -> tuple[report.Fetched, dict[str, list[dict[str, Any]]]]:
    """Fetch the archived days in range under ``root`` and run every section with
    ``engine`` (``report.ENGINES``)."""
    from notiflow.adapters.object_store import ObjectStore

    store, prefix = ObjectStore.open(settings.archive.uri, settings.object_store)
    docs = await manifests(settings, lambda day, tenant: since <= day <= until and (
        tenants is None or tenant in tenants))
    fetched = await report.fetch(store, prefix, docs, root)
    if not fetched.parts:
        return fetched, {}
    results = await asyncio.to_thread(report.run, report.ENGINES[engine](root))
    return fetched, results


def print_results(results: dict[str, list[dict[str, Any]]]) -> None:
    for name, rows in results.items():
        table = Table(title=report.TITLES[name], title_justify="left")
        if not rows:
            console.print(f"{report.TITLES[name]}: no rows")
            continue
        for column in rows[0]:
            table.add_column(column, justify="right" if isinstance(rows[0][column], int | float)
                             else "left")
        for row in rows:
            table.add_row(*(str(v) for v in row.values()))
        console.print(table)


def report_command(
    since: Annotated[str | None, typer.Option(
        "--from", help="First day (YYYY-MM-DD, UTC). Default: 30 days ago.")] = None,
    until: Annotated[str | None, typer.Option(
        "--to", help="Last day (YYYY-MM-DD). Default: today.")] = None,
    tenant: Annotated[list[str] | None, typer.Option(
        help="Only this tenant; repeat for several.")] = None,
    out: Annotated[Path, typer.Option(help="Where report.json and the PNG plots go.")
                   ] = Path("report"),
    engine: Annotated[str, typer.Option(
        help="chdb (embedded ClickHouse, ClickHouse SQL) or duckdb.")] = "chdb",
) -> None:
    """Delivery latency percentiles by provider, country and tier, error rates by provider
    and code, a funnel per campaign: from the archive (``notiflow archive run``)."""
    if engine not in report.ENGINES:
        console.print(f"[red]--engine:[/red] one of {', '.join(report.ENGINES)}")
        raise typer.Exit(2)
    settings = load_settings()
    today = datetime.now(UTC).date()
    first = _day(since, today - timedelta(days=30), "--from")
    last = _day(until, today, "--to")
    with report.temporary_root() as tmp:
        fetched, results = asyncio.run(build(settings, first, last, tenant, Path(tmp),
                                             engine))
    if not fetched.parts:
        console.print(f"nothing archived between {first} and {last} under "
                      f"{settings.archive.uri} (notiflow archive run)")
        raise typer.Exit(1)
    console.print(f"{len(fetched.parts)} archived (day, tenant)s from {first} to {last}, "
                  f"engine {engine}")
    print_results(results)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"from": first.isoformat(), "to": last.isoformat(), "engine": engine,
           "parts": [list(p) for p in fetched.parts], "sections": results}
    (out / "report.json").write_text(json.dumps(doc, indent=2, default=str))
    for path in report.plot(results, out):
        console.print(f"wrote {path}")
    console.print(f"wrote {out / 'report.json'}")
