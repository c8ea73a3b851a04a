"""``notiflow``: the one command line for every process and operator task."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.console import Console
from rich.table import Table
from typer._click import Command, Context  # typer's own copy of click: its groups' types
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_group
from typer.models import CommandInfo

from notiflow.ops.webhooks_cli import flow_webhooks
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings, load_settings

if TYPE_CHECKING:
    from notiflow.flows.common.runner import Membership
    from notiflow.schemas.user_sends import UserSendRecord

LAZY: Final = {
    "dlq": "notiflow.ops.dlq_cli:dlq_app",
    "schedules": "notiflow.ops.schedules:schedules_app",
    "campaigns": "notiflow.ops.campaigns_cli:campaigns_app",
    "archive": "notiflow.ops.archive_cli:archive_app",
    "report": "notiflow.ops.report_cli:report_command",
    "messages": "notiflow.ops.messages_cli:messages_command",
    "audit": "notiflow.ops.audit_cli:audit_command",
    "chaos": "notiflow.ops.chaos_cli:chaos_command",
    "top": "notiflow.ops.top:top_command",
    "bench": "notiflow.bench.cli:bench_app",
}
"""Operator and benchmark commands: ``name → "module:attribute"`` (a Typer app or a command
function), imported only when named, so ``notiflow api``, ``notiflow fakes`` and the flows load
none of their modules (and the drivers those import)."""


class LazyCommands(TyperGroup):
    """The root group: its own commands, then those of ``LAZY``, each built on first use."""

    def list_commands(self, ctx: Context) -> list[str]:
        own = super().list_commands(ctx)
        return [*own, *(name for name in LAZY if name not in own)]

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name in LAZY and cmd_name not in self.commands:
            self.commands[cmd_name] = lazy_command(cmd_name, LAZY[cmd_name])
        return super().get_command(ctx, cmd_name)


def lazy_command(name: str, target: str) -> Command:
    module, attribute = target.split(":")
    found = getattr(importlib.import_module(module), attribute)
    command: Command = get_group(found) if isinstance(found, typer.Typer) else \
        get_command_from_info(CommandInfo(name=name, callback=found),
                              pretty_exceptions_short=True, rich_markup_mode="rich")
    command.name = name
    return command


app = typer.Typer(cls=LazyCommands, add_completion=False, no_args_is_help=True, help=__doc__)
stack_app = typer.Typer(no_args_is_help=True,
                        help="Local Kafka, Cassandra, Redis and SeaweedFS (S3).")
flow_app = typer.Typer(no_args_is_help=True, help="Bytewax dataflows.")
schemas_app = typer.Typer(no_args_is_help=True, help="Wire contracts.")
app.add_typer(stack_app, name="stack")
app.add_typer(flow_app, name="flow")
app.add_typer(schemas_app, name="schemas")
flow_app.command("webhooks")(flow_webhooks)
console = Console(width=None if sys.stdout.isatty() else 120)


def _settings() -> Settings:
    try:
        return load_settings()
    except Exception as exc:
        console.print(f"[red]invalid configuration:[/red] {exc}")
        raise typer.Exit(2) from None


PeersDns = Annotated[str | None, typer.Option(
    help="Find -i and -a in DNS: this pod's StatefulSet ordinal and every member named "
    "<set>-<i>.<this domain> (the set's headless service, e.g. send-p1.notiflow.svc); the "
    "process restarts itself when the set is rescaled (docs/kubernetes.md).")]
PeerPort = Annotated[int, typer.Option(help="The Bytewax port of every member (--peers-dns).")]


def _membership(s: Settings, process_id: int | None, addresses: str | None,
                peers_dns: str | None, peer_port: int) -> Membership:
    from notiflow.adapters.cluster_peers import PeersError
    from notiflow.flows.common.runner import membership

    try:
        return membership(s, process_id, addresses, peers_dns, peer_port)
    except (PeersError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


def _stack_call(fn_name: str, nodes: int | None = None, **kwargs: object) -> None:
    from notiflow.ops.stack import Stack, StackError

    try:
        stack = Stack(_settings(), log=lambda m: console.print(m, highlight=False), nodes=nodes)
        getattr(stack, fn_name)(**kwargs)
    except (StackError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(1) from None


@stack_app.command("up")
def stack_up(nodes: Annotated[int | None, typer.Option(
        min=1, max=5, help="Kafka brokers and Cassandra nodes, on 127.0.0.1-N (default: as "
        "the stack directory's data was made, else 1). With 3: replication factor 3; then "
        "`eval \"$(notiflow stack env)\"` points every process at all of them.")] = None,
             ) -> None:
    """Start Kafka, Cassandra, Redis and S3 (idempotent), create topics, apply migrations."""
    _stack_call("up", nodes=nodes)


@stack_app.command("env")
def stack_env() -> None:
    """Print the `export NOTIFLOW_...` lines with which processes use this stack (for a
    one-node stack, whose addresses are the defaults, only the S3 key pair)."""
    import shlex

    from notiflow.ops.stack import Stack

    for name, value in Stack(_settings()).client_env().items():
        print(f"export {name}={shlex.quote(value)}")


@stack_app.command("down")
def stack_down(wipe: Annotated[bool, typer.Option(help="Delete all data too.")] = False) -> None:
    """Stop the local stack."""
    _stack_call("down", wipe=wipe)


@stack_app.command("fetch")
def stack_fetch() -> None:
    """Download the Kafka and Cassandra jars from Maven Central (cached)."""
    _stack_call("fetch")


@stack_app.command("kube-tools")
def stack_kube_tools() -> None:
    """Build helm and kubeconform and write the Kubernetes and KEDA schemas that check the
    Helm chart offline (cached; tests/unit/test_helm_chart.py)."""
    from notiflow.ops.kube_tools import KubeToolsError, ensure

    try:
        t = ensure(_settings().cache_dir.expanduser(), log=console.print)
    except KubeToolsError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    console.print(f"helm {t.helm}\nkubeconform {t.kubeconform}\nschemas {t.schemas}")


@stack_app.command("init")
def stack_init() -> None:
    """Create topics and apply migrations on an already running stack (e.g. docker compose)."""
    _stack_call("init")


@stack_app.command("migrate")
def stack_migrate() -> None:
    """Apply pending CQL migrations."""
    _stack_call("migrate")


@stack_app.command("status")
def stack_status() -> None:
    """Show each component's pid, port and health; exit 1 if any is down."""
    from notiflow.ops.stack import Stack

    table = Table("component", "pid", "address", "state")
    ok = True
    for name, pid, address, healthy in Stack(_settings()).status():
        ok &= healthy
        state = "[green]up[/green]" if healthy else ("[yellow]unhealthy[/yellow]" if pid
                                                     else "[red]down[/red]")
        table.add_row(name, str(pid or "-"), address, state)
    console.print(table)
    raise typer.Exit(0 if ok else 1)


@app.command("api")
def api(
    lane: Annotated[str | None, typer.Option(
        help="all (default: settings.api_lane), priority (P0/P1 sends) or bulk (P2/P3 sends "
             "and provider webhooks, niced).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default: api_port).")] = None,
    processes: Annotated[int | None, typer.Option(
        min=1, max=64, help="Worker processes sharing the port, supervised (default: "
        "api_processes, 1). One process uses about one core at most (the GIL).")] = None,
) -> None:
    """Messaging API and provider webhook receiver (uvicorn)."""
    from notiflow.gateway.app import serve

    serve(api_settings(_settings(), lane, port, processes))


def api_settings(settings: Settings, lane: str | None, port: int | None,
                 processes: int | None) -> Settings:
    """``settings`` with the options of ``notiflow api`` that were given."""
    update: dict[str, object] = {}
    if lane is not None:
        if lane not in ("all", "priority", "bulk"):
            raise typer.BadParameter("lane must be all, priority or bulk")
        update["api_lane"] = lane
    if port is not None:
        update["api_port"] = port
    if processes is not None:
        update["api_processes"] = processes
    return settings.model_copy(update=update) if update else settings


@app.command("inbox")
def inbox(
    port: Annotated[int | None, typer.Option(help="Listen port (default: inbox.port).")] = None,
) -> None:
    """The in-app inbox's live server: WebSocket, server-sent events, GET /v1/inbox."""
    from notiflow.inbox.server import serve

    settings = _settings()
    if port is not None:
        settings = settings.model_copy(update={
            "inbox": settings.inbox.model_copy(update={"port": port})})
    serve(settings)


@app.command("fakes")
def fakes(
    realtime: Annotated[int, typer.Option(
        min=0, max=99, help="Run in the real-time class at this priority (0: normal): "
        "benchmarks keep the emulated providers' latency out of the machine's load.")] = 0,
) -> None:
    """Local emulators of the provider APIs on loopback."""
    from notiflow import tuning
    from notiflow.extras import needs

    settings = _settings()
    with needs("emulators", "notiflow fakes"):
        from notiflow.fakes.server import factories, serve

        factories(settings)

    tuning.set_realtime(realtime)
    serve(settings)


@flow_app.command("send")
def flow_send(
    tier: Annotated[Tier | None, typer.Option(case_sensitive=False,
                                              help="Tier to serve.")] = None,
    mode: Annotated[str, typer.Option(help="tiered (default) or shared (baseline: one topic, "
                                      "one flow for all tiers).")] = "tiered",
    process_id: Annotated[int | None, typer.Option("-i", "--process-id")] = None,
    addresses: Annotated[str | None, typer.Option("-a", "--addresses",
                                                  help="host:port;host:port")] = None,
    peers_dns: PeersDns = None,
    peer_port: PeerPort = 2101,
    recovery_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Run the send dataflow of one tier (with Bytewax recovery), or the shared baseline."""
    from notiflow.flows.common.runner import run_flow
    from notiflow.flows.send.flow import build_send_flow

    if mode not in ("tiered", "shared") or (mode == "tiered") == (tier is None):
        console.print("[red]give --tier P0..P3, or --mode shared without a tier[/red]")
        raise typer.Exit(2)
    s = _settings()
    if mode == "shared":
        s = s.model_copy(update={"mode": "shared"})
    name = "send-shared" if tier is None else f"send-{tier.value.lower()}"
    policy = s.policy(tier) if tier is not None else None
    members = _membership(s, process_id, addresses, peers_dns, peer_port)
    run_flow(lambda: build_send_flow(s, tier, workers=members.workers), s, name,
             members=members, recovery_dir=recovery_dir,
             nice=policy.nice if policy else 0, realtime=policy.realtime if policy else 0,
             epoch=policy.epoch if policy else None)


@flow_app.command("reconcile")
def flow_reconcile(
    process_id: Annotated[int | None, typer.Option("-i", "--process-id")] = None,
    addresses: Annotated[str | None, typer.Option("-a", "--addresses")] = None,
    peers_dns: PeersDns = None,
    peer_port: PeerPort = 2101,
    recovery_dir: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Run the reconciliation dataflow (status events + receipts → Cassandra)."""
    from notiflow.flows.common.runner import run_flow
    from notiflow.flows.receipts.reconcile import build_reconcile_flow

    s = _settings()
    run_flow(lambda: build_reconcile_flow(s), s, "reconcile",
             members=_membership(s, process_id, addresses, peers_dns, peer_port),
             recovery_dir=recovery_dir, nice=s.reconcile_nice)


@flow_app.command("scheduler")
def flow_scheduler(
    name: Annotated[str | None, typer.Option(
        help="This scheduler's identity in the shard leases (default host:pid:random).")] = None,
) -> None:
    """Run a scheduler: publishes scheduled P2/P3 messages from Cassandra's time buckets when
    they fall due; run several for failover (shards are leased, docs/architecture.md)."""
    from notiflow.adapters.send_ports import sender_identity
    from notiflow.flows.scheduling.due_work import main

    main(_settings(), name or sender_identity())


@flow_app.command("expander")
def flow_expander(
    name: Annotated[str | None, typer.Option(
        help="This expander's identity in the campaign leases (default host:pid:random).")
    ] = None,
) -> None:
    """Run a campaign expander: turns the rows of running campaigns' manifests into P2/P3
    messages at their pace; run several for failover (campaigns are leased)."""
    from notiflow.adapters.send_ports import sender_identity
    from notiflow.flows.campaigns.expander import main

    main(_settings(), name or sender_identity())


@app.command("status")
def status(message_id: str) -> None:
    """Print a message's current status, attempts and history from Cassandra; for a send
    to a user, its decision and its messages."""
    from notiflow.ops.inspect import message_history, user_send

    s = _settings()
    history = asyncio.run(message_history(s, message_id))
    if history is None:
        decided = asyncio.run(user_send(s, message_id))
        if decided is None:
            console.print(f"[red]no message {message_id}[/red]")
            raise typer.Exit(1)
        _print_user_send(*decided)
        return
    msg, attempts, events = history
    console.print(
        f"[bold]{message_id}[/bold]  status=[bold]{msg.status}[/bold]"
        f"{'  reason=' + msg.reason if msg.reason else ''}  tenant={msg.tenant_id}  "
        f"{msg.channel}/{msg.tier}  recipient={msg.recipient_masked}",
        highlight=False,
    )
    table = Table("time (UTC)", "status", "attempt", "reason", "source", "applied", title="history")
    for e in events:
        table.add_row(str(e.occurred_at), e.status, str(e.attempt), e.reason or "",
                      e.source or "", "yes" if e.applied else "no (superseded)")
    console.print(table)
    if attempts:
        at = Table("#", "provider", "outcome", "provider message id", "error", "started",
                   "completed", title="attempts")
        for a in attempts:
            at.add_row(str(a.attempt_no), a.provider_id, a.outcome,
                       a.provider_message_id or "", a.normalized_error or "",
                       str(a.started_at), str(a.completed_at))
        console.print(at)


def _print_user_send(record: UserSendRecord, statuses: dict[str, str | None]) -> None:
    console.print(f"[bold]{record.message_id}[/bold]  send to a user  tenant={record.tenant_id}"
                  f"  {record.tier.value}/{record.category.value}  deliver={record.deliver}"
                  f"  accepted={record.accepted_at}"
                  f"  user preferences version={record.user_preferences_version}",
                  highlight=False)
    sent = Table("channel", "address", "message", "status", "preferences version",
                 title="sent to")
    for leg, pick in zip(record.messages, record.picks, strict=True):
        sent.add_row(leg.channel.value, leg.address, leg.message_id,
                     statuses.get(leg.message_id) or "", str(pick.preferences_version))
    console.print(sent)
    skipped = Table("channel", "address #", "reason", title="skipped")
    for skip in record.skipped:
        skipped.add_row(skip.channel.value, "" if skip.index is None else str(skip.index),
                        skip.reason)
    console.print(skipped)


@app.command("demo")
def demo(
    messages: Annotated[int, typer.Option(help="Messages to send through the API.")] = 400,
    keep_running: Annotated[bool, typer.Option(help="Leave stack and processes up.")] = False,
) -> None:
    """Stack up, fakes, API, flows; send traffic through the API; print a per-tier report."""
    from notiflow.ops.demo import run_demo

    code = run_demo(messages=messages, keep_running=keep_running, console=console)
    raise typer.Exit(code)


@schemas_app.command("export")
def schemas_export(
    out: Annotated[Path, typer.Option(help="Target folder.")] = Path("notiflow/schemas/json"),
) -> None:
    """Write the JSON Schema of every wire contract."""
    from notiflow.schemas.messages import json_schemas

    out.mkdir(parents=True, exist_ok=True)
    for name, schema in json_schemas().items():
        (out / f"{name}.schema.json").write_text(json.dumps(schema, indent=2, sort_keys=True)
                                                 + "\n")
        console.print(f"wrote {out / name}.schema.json")




def main() -> None:
    from notiflow.extras import MissingExtra

    try:
        app(prog_name="notiflow")
    except MissingExtra as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1) from e


if __name__ == "__main__":
    main()
