"""``notiflow messages``: a tenant's recent messages from Cassandra, newest first (the
terminal twin of ``GET /v1/messages``; registered on ``notiflow.cli``).

Reads ``messages_by_tenant_day`` joined with ``messages`` through
:meth:`~notiflow.adapters.cassandra.listing.MessageListing.recent_messages`, directly (no
API, no tenant token: an operator tool). Without ``--tenant`` every configured tenant is listed
and the pages are merged. Recipients appear only masked (``messages.recipient_masked``).
Exit codes: 0 listed (also when empty), 1 Cassandra unreachable, 2 bad arguments.
"""

from __future__ import annotations

import asyncio
import re
import sys
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from notiflow.adapters.rows import MessageRow
from notiflow.schemas.enums import Status
from notiflow.settings import Settings

console = Console(width=None if sys.stdout.isatty() else 200)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str, now: datetime) -> datetime:
    """``90s``, ``15m``, ``1h``, ``7d`` (before ``now``) or an ISO 8601 time (UTC when it has
    no offset); ValueError otherwise."""
    m = _DURATION.fullmatch(text.strip())
    if m:
        return now - timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
    at = datetime.fromisoformat(text.strip())
    return at if at.tzinfo else at.replace(tzinfo=UTC)


async def collect(settings: Settings, tenants: list[str], since: datetime, limit: int,
                  status: Status | None, now: datetime) -> list[MessageRow]:
    """Up to ``limit`` newest message rows of ``tenants`` accepted at or after ``since``
    (paging through each tenant's list until ``limit`` or its end)."""
    from notiflow.adapters.cassandra.session import connect
    from notiflow.adapters.cassandra.store import CassandraStore

    cluster, session = await asyncio.to_thread(connect, settings)
    try:
        store = CassandraStore(session, settings)

        async def one(tenant_id: str) -> list[MessageRow]:
            rows: list[MessageRow] = []
            after = None
            while len(rows) < limit:
                page = await store.listing.recent_messages(
                    tenant_id, since, limit=limit - len(rows), now=now, status=status,
                    after=after)
                rows += page.messages
                if page.next is None:
                    break
                after = page.next
            return rows

        found = [r for rows in await asyncio.gather(*(one(t) for t in tenants)) for r in rows]
    finally:
        cluster.shutdown()
    epoch = datetime.fromtimestamp(0, UTC)
    found.sort(key=lambda r: r.accepted_at or epoch, reverse=True)
    return found[:limit]


def _when(d: datetime | None) -> str:
    return d.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if d else ""


def messages_table(rows: list[MessageRow], title: str) -> Table:
    """The rows as a rich table; the recipient column is the stored mask, never the value."""
    table = Table(title=title)
    for name in ("accepted (UTC)", "message id", "tenant", "channel", "tier", "status"):
        table.add_column(name, no_wrap=True)
    table.add_column("reason")
    table.add_column("att.", justify="right")
    table.add_column("recipient", no_wrap=True)
    table.add_column("updated (UTC)")
    for r in rows:
        table.add_row(_when(r.accepted_at), r.message_id, r.tenant_id or "", r.channel or "",
                      r.tier or "", r.status or "", r.reason or "", str(r.attempt or 0),
                      r.recipient_masked or "", _when(r.updated_at))
    return table


def messages_command(
    tenant: Annotated[str | None, typer.Option(
        help="Tenant id (default: every configured tenant).")] = None,
    since: Annotated[str, typer.Option(
        help="How far back: 90s, 15m, 1h, 7d or an ISO 8601 time.")] = "1h",
    status: Annotated[str | None, typer.Option(
        help="Only messages now in this status, e.g. FAILED.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="Rows to show.")] = 50,
) -> None:
    """List a tenant's recent messages (newest first) from Cassandra; recipients masked."""
    from notiflow.settings import load_settings

    try:
        settings = load_settings()
    except Exception as exc:
        console.print(f"[red]invalid configuration:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    now = datetime.now(UTC)
    try:
        lower = parse_since(since, now)
        wanted = Status(status.upper()) if status else None
    except ValueError:
        console.print(f"[red]bad --since or --status[/red] (statuses: "
                      f"{', '.join(s.value for s in Status)})", highlight=False)
        raise typer.Exit(2) from None
    if now - lower > settings.operational_ttl:
        lower = now - settings.operational_ttl
    tenants = [tenant] if tenant else [t.id for t in settings.tenants]
    if not tenants:
        console.print("[red]no tenants configured: pass --tenant[/red]")
        raise typer.Exit(2)
    try:
        rows = asyncio.run(collect(settings, tenants, lower, limit, wanted, now))
    except Exception as exc:
        console.print(f"[red]cannot read Cassandra:[/red] {type(exc).__name__}: {exc}",
                      highlight=False)
        raise typer.Exit(1) from None
    what = f"{', '.join(tenants)} since {lower:%Y-%m-%d %H:%M:%S} UTC"
    if wanted:
        what += f", status {wanted.value}"
    console.print(messages_table(rows, f"{len(rows)} message(s): {what}"), highlight=False)
