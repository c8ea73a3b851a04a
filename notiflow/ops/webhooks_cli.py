"""``notiflow flow webhooks``: the client status webhook dataflow as a command (registered
on the ``flow`` sub-app of ``notiflow.cli``; ``python -m notiflow.ops.webhooks_cli`` runs it
on its own). Contracts: ``docs/webhooks.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from notiflow.settings import load_settings


def flow_webhooks(
    process_id: Annotated[int | None, typer.Option("-i", "--process-id")] = None,
    addresses: Annotated[str | None, typer.Option("-a", "--addresses",
                                                  help="host:port;host:port")] = None,
    peers_dns: Annotated[str | None, typer.Option(
        help="Find -i and -a in DNS (a StatefulSet's headless service domain; see "
        "`notiflow flow send --help`).")] = None,
    peer_port: Annotated[int, typer.Option(help="The Bytewax port of every member.")] = 2101,
    recovery_dir: Annotated[Path | None, typer.Option()] = None,
    receipts: Annotated[bool, typer.Option(
        help="Also announce the statuses of provider receipts (notify.receipts).")] = True,
) -> None:
    """Run the client webhook dataflow (status events → Standard Webhooks-signed POSTs to
    each message's status_webhook; exhausted ones → notify.dlq.webhooks), with recovery."""
    from notiflow.adapters.cluster_peers import PeersError
    from notiflow.flows.common.runner import membership, run_flow
    from notiflow.flows.webhooks.status_webhooks import build_webhook_flow

    try:
        s = load_settings()
    except Exception as exc:
        typer.echo(f"invalid configuration: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        members = membership(s, process_id, addresses, peers_dns, peer_port)
    except (PeersError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    run_flow(lambda: build_webhook_flow(s, receipts=receipts), s, "webhooks",
             members=members, recovery_dir=recovery_dir, nice=s.reconcile_nice)


def main() -> None:
    app = typer.Typer(add_completion=False)
    app.command()(flow_webhooks)
    app(prog_name="notiflow-webhooks")


if __name__ == "__main__":
    main()
