"""``notiflow schedules list|show``: recurring schedules as operators read them, from Cassandra
(recipients masked; the encrypted message request is not shown)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.table import Table

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.schedule_store import ScheduleRow, ScheduleStore
from notiflow.schemas.recurrence import occurrences
from notiflow.settings import Settings

schedules_app = typer.Typer(help="Recurring schedules (read-only; change them through the API).",
                            no_args_is_help=True)
console = Console()


async def _rows(settings: Settings, tenant: str, schedule_id: str | None
                ) -> list[ScheduleRow]:
    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        store = ScheduleStore(session, settings)
        if schedule_id is not None:
            row = await store.get(tenant, schedule_id)
            return [row] if row is not None else []
        return await store.of_tenant(tenant)
    finally:
        cluster.shutdown()


def coming(row: ScheduleRow, n: int) -> list[datetime]:
    """The next ``n`` occurrences of an active schedule."""
    if row.state != "active":
        return []
    rec = row.recurrence()
    now = datetime.now(UTC)
    until = row.ends_at or now.replace(year=now.year + 2)
    return occurrences(rec, now, until, limit=n) if until > now else []


@schedules_app.command("list")
def list_schedules(tenant: str = typer.Option(..., help="Tenant id."),
                   deleted: bool = typer.Option(False, help="Include deleted schedules.")
                   ) -> None:
    """A tenant's schedules: expression, zone, state, next occurrence, materialised until."""
    rows = asyncio.run(_rows(Settings(), tenant, None))
    table = Table("schedule", "state", "expression", "zone", "message", "next (UTC)",
                  "materialised until")
    for r in rows:
        if r.state == "deleted" and not deleted:
            continue
        nxt = coming(r, 1)
        table.add_row(r.schedule_id, r.state, f"{r.kind}: {r.expression}", r.timezone,
                      f"{r.channel}/{r.tier} {r.template_id} v{r.template_version} to "
                      f"{r.recipient_masked}", nxt[0].isoformat() if nxt else "-",
                      r.materialized_until.isoformat() if r.materialized_until else "-")
    console.print(table)


@schedules_app.command("show")
def show_schedule(schedule_id: str, tenant: str = typer.Option(..., help="Tenant id."),
                  n: int = typer.Option(10, help="Occurrences to list.")) -> None:
    """One schedule and its next ``n`` occurrences (UTC and the schedule's zone)."""
    rows = asyncio.run(_rows(Settings(), tenant, schedule_id))
    if not rows:
        console.print(f"[red]no schedule {schedule_id} for tenant {tenant}[/red]")
        raise typer.Exit(1)
    r = rows[0]
    console.print(f"[bold]{r.schedule_id}[/bold]  state={r.state}  {r.kind}: {r.expression}  "
                  f"zone={r.timezone}  from {r.starts_at.isoformat()}"
                  f"{' until ' + r.ends_at.isoformat() if r.ends_at else ''}", highlight=False)
    console.print(f"message: {r.channel}/{r.tier} template {r.template_id} "
                  f"v{r.template_version} to {r.recipient_masked}", highlight=False)
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(r.timezone)
    table = Table("occurrence (UTC)", f"local ({r.timezone})")
    for at in coming(r, n):
        table.add_row(at.isoformat(), at.astimezone(zone).isoformat())
    console.print(table)
