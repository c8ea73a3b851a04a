"""``notiflow audit``: the audit trail (``notiflow/audit.py``): template versions created,
tenant policy and credential changes, P0 use per tenant, dead-letter reveal/replay/purge."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from notiflow.audit import Action, AuditEvent
from notiflow.ops.messages_cli import parse_since
from notiflow.settings import Settings, load_settings

console = Console()


async def collect(settings: Settings, since: datetime, until: datetime) -> list[AuditEvent]:
    from notiflow.adapters.audit import AuditLog
    from notiflow.adapters.cassandra.session import connect

    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        audit_log = await asyncio.to_thread(AuditLog, session)
        return await audit_log.read(since, until)
    finally:
        await asyncio.to_thread(cluster.shutdown)


def select(events: list[AuditEvent], tenant: str | None,
           action: str | None) -> list[AuditEvent]:
    """``action`` matches exactly or as a prefix before a dot (``dlq`` → ``dlq.replay``)."""
    return [e for e in events
            if (tenant is None or e.tenant_id == tenant)
            and (action is None or e.action == action or e.action.startswith(f"{action}."))]


def p0_totals(events: list[AuditEvent]) -> Counter[str]:
    """P0 acceptances per tenant over ``events`` (their ``p0.use`` rows)."""
    totals: Counter[str] = Counter()
    for e in events:
        if e.action == Action.P0_USE and e.tenant_id:
            totals[e.tenant_id] += int(e.detail.get("count", 0))
    return totals


def audit_command(
    since: Annotated[str, typer.Option(help="From: 90s, 15m, 1h, 7d ago, or an ISO time.")
                     ] = "24h",
    until: Annotated[str | None, typer.Option(help="To (default now); same forms.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's events.")] = None,
    action: Annotated[str | None, typer.Option(
        help="Only this action: template.create, tenant.policy, credentials.rotated, "
        "p0.use, dlq (or dlq.reveal, dlq.replay, dlq.purge, ...).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Print the audit trail, newest first, and the P0 use per tenant over the period."""
    try:
        settings = load_settings()
    except Exception as exc:
        console.print(f"[red]invalid configuration:[/red] {escape(str(exc))}")
        raise typer.Exit(2) from None
    now = datetime.now(UTC)
    try:
        lower = parse_since(since, now)
        upper = parse_since(until, now) if until else now
    except ValueError:
        console.print("[red]bad --since or --until[/red]")
        raise typer.Exit(2) from None
    events = select(asyncio.run(collect(settings, lower, upper)), tenant, action)
    if as_json:
        for e in events:
            print(json.dumps({"at": e.at.isoformat(), "action": e.action, "actor": e.actor,
                              "tenant": e.tenant_id, "subject": e.subject,
                              "detail": e.detail}, default=str))
        return
    table = Table("time (UTC)", "action", "actor", "tenant", "subject", "detail",
                  title=f"audit {lower:%Y-%m-%d %H:%M} → {upper:%Y-%m-%d %H:%M} UTC")
    for e in events:
        table.add_row(f"{e.at:%Y-%m-%d %H:%M:%S}", e.action, escape(e.actor),
                      e.tenant_id or "", escape(e.subject),
                      escape(json.dumps(e.detail, default=str))[:160])
    console.print(table)
    totals = p0_totals(events)
    if totals:
        console.print("P0 use: " + ", ".join(f"{t} {n}" for t, n in sorted(totals.items())),
                      highlight=False)
