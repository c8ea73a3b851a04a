"""``notiflow campaigns``: create, follow and steer campaigns through the API (as a marketing
team does, with the tenant's token), and put manifests into the object store."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from notiflow.settings import Settings, load_settings

campaigns_app = typer.Typer(help="Campaigns: create, list, show, pause, resume, cancel "
                                 "(through the API), upload manifests.",
                            no_args_is_help=True)
console = Console()
FINAL = frozenset({"cancelled", "completed", "failed"})
COUNTS = ("read", "expanded", "rejected", "waiting", "provider_accepted", "delivered",
          "failed", "suppressed", "expired", "cancelled")

Api = Annotated[str | None, typer.Option(help="API base URL (default: the configured "
                                              "api_host:api_port).")]
Token = Annotated[str | None, typer.Option(envvar="NOTIFLOW_TOKEN", help="The tenant's "
                                           "bearer token (env NOTIFLOW_TOKEN).")]


def _client(api: str | None, token: str | None) -> httpx.Client:
    if not token:
        console.print("[red]a tenant token is required: --token or NOTIFLOW_TOKEN[/red]")
        raise typer.Exit(2)
    s = load_settings()
    base = api or f"http://{s.api_host}:{s.api_port}"
    return httpx.Client(base_url=base, timeout=30,
                        headers={"Authorization": f"Bearer {token}"})


def _answer(resp: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = resp.json() if resp.content else {}
    if resp.status_code >= 400:
        reason = body.get("reason") or body.get("error") or resp.status_code
        extra = f" (retry after {resp.headers['retry-after']} s)" \
            if "retry-after" in resp.headers else ""
        console.print(f"[red]{resp.status_code} {reason}:[/red] {body.get('message', '')}"
                      f"{extra}")
        for d in body.get("details") or ():
            console.print(f"  {'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}")
        raise typer.Exit(1)
    return body


def summary(c: dict[str, Any]) -> Table:
    """A campaign's state and counts as a table."""
    table = Table(title=f"{c['campaign_id']} — {c['name']}", show_header=False)
    table.add_row("state", c["state"] + (f" ({c['reason']})" if c.get("reason") else ""))
    table.add_row("template", f"{c['channel']}/{c['tier']} {c['template_id']} "
                              f"v{c['template_version']}")
    table.add_row("window", f"{c['starts_at']} → {c['ends_at']}")
    for name in COUNTS:
        table.add_row(name, f"{c['counts'].get(name, 0):,}")
    if c.get("remaining") is not None:
        table.add_row("remaining", f"{c['remaining']:,}")
    if c.get("rate"):
        table.add_row("rate", f"{c['rate']:,.0f} rows/s")
    if c.get("eta"):
        table.add_row("eta", c["eta"])
    return table


def follow(client: httpx.Client, campaign_id: str, every: float = 1.0) -> dict[str, Any]:
    """A live progress bar of bytes read until the campaign ends; its last view."""
    c = _answer(client.get(f"/v1/campaigns/{campaign_id}"))
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.percentage:>5.1f} %"), TextColumn("{task.fields[line]}"),
                  TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task(c["state"], total=c.get("manifest_bytes") or 1, line="")
        while True:
            k = c["counts"]
            bar.update(task, completed=c.get("bytes_read", 0), description=c["state"],
                       line=f"{k['expanded']:,} expanded · {k['rejected']:,} rejected · "
                            f"{k['provider_accepted']:,} accepted by providers")
            if c["state"] in FINAL:
                break
            time.sleep(every)
            c = _answer(client.get(f"/v1/campaigns/{campaign_id}"))
    return c


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, column = v.partition("=")
        if not sep or not name or not column:
            console.print(f"[red]{what} must be NAME=COLUMN, got {v!r}[/red]")
            raise typer.Exit(2)
        out[name] = column
    return out


@campaigns_app.command("create")
def create(
    name: Annotated[str, typer.Option(help="Campaign name.")],
    manifest: Annotated[str, typer.Option(help="s3://bucket/tenants/<tenant>/key (.csv or "
                                               ".jsonl), as `upload` printed it.")],
    template: Annotated[str, typer.Option(help="Template id.")],
    version: Annotated[int, typer.Option(help="Template version.")],
    channel: Annotated[str, typer.Option(help="sms, email or push.")],
    recipient: Annotated[str, typer.Option(help="Manifest column of the recipient.")],
    var: Annotated[list[str], typer.Option(help="Template variable from a column: "
                                                "NAME=COLUMN (repeatable).")] = [],  # noqa: B006
    tier: Annotated[str, typer.Option(help="P2 or P3.")] = "P3",
    timezone_column: Annotated[str | None, typer.Option(help="Column of each recipient's "
                                                              "IANA zone.")] = None,
    platform_column: Annotated[str | None, typer.Option(help="Column of the push platform "
                                                              "(push only).")] = None,
    window: Annotated[str | None, typer.Option(help="Local send window, e.g. 10:00-20:00.")
                      ] = None,
    rate: Annotated[float | None, typer.Option(help="Messages/s at most.")] = None,
    quota: Annotated[int | None, typer.Option(help="Messages at most.")] = None,
    starts_at: Annotated[str | None, typer.Option(help="ISO 8601 start (default now).")
                         ] = None,
    ends_at: Annotated[str | None, typer.Option(help="ISO 8601 end of the window.")] = None,
    wait: Annotated[bool, typer.Option(help="Follow with a progress bar until it ends.")
                    ] = True,
    api: Api = None, token: Token = None,
) -> None:
    """Create a campaign, then follow it with a live progress bar and print a summary."""
    body: dict[str, Any] = {
        "name": name, "channel": channel, "tier": tier, "template_id": template,
        "template_version": version, "manifest": manifest,
        "mapping": {"recipient": recipient, "variables": _pairs(var, "--var"),
                    "timezone": timezone_column, "platform": platform_column},
        "max_rate": rate, "quota": quota, "starts_at": starts_at, "ends_at": ends_at}
    if window:
        start, _, end = window.partition("-")
        body["window"] = {"start": start, "end": end}
    with _client(api, token) as client:
        c = _answer(client.post("/v1/campaigns", json={k: v for k, v in body.items()
                                                      if v is not None}))
        console.print(f"campaign [bold]{c['campaign_id']}[/bold] {c['state']}")
        if wait:
            c = follow(client, c["campaign_id"])
        console.print(summary(c))


@campaigns_app.command("list")
def list_campaigns(api: Api = None, token: Token = None) -> None:
    """The tenant's campaigns, newest first."""
    with _client(api, token) as client:
        rows = _answer(client.get("/v1/campaigns"))["campaigns"]
    table = Table("name", "state", "read", "expanded", "rejected", "provider accepted",
                  "created")
    table.add_column("campaign", no_wrap=True, min_width=36)
    for c in rows:
        k = c["counts"]
        table.add_row(c["name"], c["state"], f"{k['read']:,}", f"{k['expanded']:,}",
                      f"{k['rejected']:,}", f"{k['provider_accepted']:,}",
                      c["created_at"][:19], c["campaign_id"])
    console.print(table)


@campaigns_app.command("show")
def show(campaign_id: str, watch: Annotated[bool, typer.Option(
        help="Follow with a progress bar until it ends.")] = False,
         errors: Annotated[int, typer.Option(help="Also list the first N rejected rows.")
                           ] = 0,
         api: Api = None, token: Token = None) -> None:
    """A campaign's state, counts, remaining rows and ETA (and its first rejected rows)."""
    with _client(api, token) as client:
        c = (follow(client, campaign_id) if watch
             else _answer(client.get(f"/v1/campaigns/{campaign_id}")))
        console.print(summary(c))
        if errors:
            report = _answer(client.get(f"/v1/campaigns/{campaign_id}/errors",
                                        params={"limit": min(errors, 1000)}))
            table = Table("row", "reason", title="rejected rows")
            for e in report["errors"]:
                table.add_row(str(e["row"]), e["reason"])
            console.print(table)


def _steer(action: str, campaign_id: str, api: str | None, token: str | None) -> None:
    with _client(api, token) as client:
        c = _answer(client.post(f"/v1/campaigns/{campaign_id}/{action}"))
    console.print(summary(c))


@campaigns_app.command("pause")
def pause(campaign_id: str, api: Api = None, token: Token = None) -> None:
    """Stop expanding (messages already expanded still go)."""
    _steer("pause", campaign_id, api, token)


@campaigns_app.command("resume")
def resume(campaign_id: str, api: Api = None, token: Token = None) -> None:
    """Expand again from where it paused."""
    _steer("resume", campaign_id, api, token)


@campaigns_app.command("cancel")
def cancel(campaign_id: str, api: Api = None, token: Token = None) -> None:
    """Stop expanding and cancel every message of it no provider took yet."""
    _steer("cancel", campaign_id, api, token)


def upload_target(settings: Settings, tenant: str, path: Path, to: str | None) -> str:
    """Where ``upload`` puts ``path`` for ``tenant``: ``to``, or the tenant's prefix plus
    the file's name; ValueError when ``to`` is not the tenant's (a campaign could not name
    it)."""
    from notiflow.adapters.manifests import tenant_location, tenant_refusal

    target = to or tenant_location(settings, tenant) + path.name
    if (refusal := tenant_refusal(settings, tenant, target)) is not None:
        raise ValueError(refusal)
    return target


@campaigns_app.command("upload")
def upload(path: Path,
           tenant: Annotated[str, typer.Option(help="The tenant whose manifest it is.")],
           to: Annotated[str | None, typer.Option(
               help="Target URI under the tenant's prefix (default: "
                    "s3://<bucket>/tenants/<tenant>/<file name>).")] = None) -> None:
    """Put a local manifest under the tenant's prefix of the object store (what a marketing
    tool would do) and print the URI a campaign names."""
    from notiflow.adapters.object_store import ObjectStore

    settings: Settings = load_settings()
    try:
        target = upload_target(settings, tenant, path, to)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    store, key = ObjectStore.open(target, settings.object_store)
    size = os.path.getsize(path)
    asyncio.run(store.put(key, path.read_bytes()))
    console.print(f"uploaded {size:,} bytes to {target}")
