"""How fast ``notiflow inbox`` pushes inbox items to many open apps, and what it costs in
memory, on the local stack.

``python -m notiflow.bench.inbox_fanout [--clients 5000] [--devices 2] [--rate 200]
[--seconds 20] [--burst 1000]`` starts ``notiflow inbox`` on a free port, opens ``clients``
WebSocket connections from a child process (``devices`` per user, each with its own user
token), then delivers items through the INAPP provider (``InboxDelivery.send``: the Cassandra
write, then the Redis publish), first at ``rate`` per second for ``seconds`` to random users,
then a burst of ``burst`` items to distinct users at once (an in-app campaign). Every client
records, for each item, the time from the publish (``published_at`` in the event) and from the
start of the send to its arrival. It prints and writes ``bench/results/inbox.{json,md,png}``:
fan-out latency p50/p90/p99/max for both phases, deliveries expected and received, the
server's RSS (before, with every client connected, peak) and CPU seconds. Client and server
share the host (2 cores here) with the stack: the latencies include the client's own event
loop lag. The development environment's settings fill what the environment does not set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import tempfile
import time
import uuid
from datetime import UTC, datetime
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil

from notiflow.adapters.providers.base import OutboundMessage
from notiflow.bench.stats import percentile
from notiflow.devenv import dev_environment, free_port
from notiflow.inbox.tokens import mint
from notiflow.ops.procs import ManagedProcess
from notiflow.providers.inbox.client import InboxDelivery
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

OUT = Path("bench/results")
TENANT = "acme"


def users_of(run: str, clients: int, devices: int) -> list[str]:
    return [f"bench-{run}-{i}" for i in range(max(1, clients // devices))]


def clients_main(url: str, key: str, audience: str, users: list[str], devices: int,
                 pipe: Pipe) -> None:
    """The child: open every connection, report ``ready``, collect arrivals until told to
    stop, then send them back."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_clients(url, key, audience, users, devices, pipe))


async def _clients(url: str, key: str, audience: str, users: list[str], devices: int,
                   pipe: Pipe) -> None:
    arrivals: list[tuple[str, float, float]] = []
    connector = aiohttp.TCPConnector(limit=0)
    opened = 0
    failed = 0
    gate = asyncio.Semaphore(100)
    sockets: list[aiohttp.ClientWebSocketResponse] = []
    async with aiohttp.ClientSession(connector=connector) as http:
        async def connect(user: str) -> None:
            nonlocal opened, failed
            token = mint(key, TENANT, user, audience=audience)
            async with gate:
                try:
                    ws = await http.ws_connect(url, params={"access_token": token},
                                               heartbeat=None, autoping=True)
                except (aiohttp.ClientError, OSError):
                    failed += 1
                    return
            opened += 1
            sockets.append(ws)
            async for msg in ws:
                if msg.type is not aiohttp.WSMsgType.TEXT:
                    continue
                now = time.time()
                doc = orjson.loads(msg.data)
                if doc.get("type") == "item":
                    arrivals.append((doc["item"]["id"], doc["published_at"], now))

        tasks = [asyncio.create_task(connect(u)) for u in users for _ in range(devices)]
        while opened + failed < len(tasks):
            await asyncio.sleep(0.2)
        pipe.send(("ready", opened, failed))
        await asyncio.to_thread(pipe.recv)
        for ws in sockets:
            await ws.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    pipe.send(("arrivals", arrivals))


def message(user: str) -> OutboundMessage:
    return OutboundMessage(message_id=f"msg_{uuid.uuid4().hex}", attempt=1, tenant_id=TENANT,
                           channel=Channel.INAPP, tier=Tier.P1, recipient=f"inapp:{user}",
                           body="Your order shipped", subject="Order update",
                           accepted_at=datetime.now(UTC), category="transactional")


async def deliver(provider: InboxDelivery, users: list[str], rate: float, seconds: float,
                  burst: int) -> tuple[dict[str, tuple[str, float]], int]:
    """Send at ``rate``/s for ``seconds``, then ``burst`` at once; item id → (phase, send
    start), and how many sends failed."""
    sent: dict[str, tuple[str, float]] = {}
    failed = 0

    async def one(phase: str, user: str) -> None:
        nonlocal failed
        m = message(user)
        sent[m.message_id] = (phase, time.time())
        result = await provider.send(m)
        if result.provider_message_id is None:
            failed += 1

    start = time.perf_counter()
    tasks = []
    for i in range(int(rate * seconds)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one("steady", random.choice(users))))
    await asyncio.gather(*tasks)
    await asyncio.sleep(1.0)
    await asyncio.gather(*(one("burst", u) for u in random.sample(users, min(burst,
                                                                              len(users)))))
    return sent, failed


def summary(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p90_ms": None, "p99_ms": None, "max_ms": None}
    def ms(p: float) -> float:
        return round((percentile(values, p) or 0.0) * 1000, 1)

    return {"p50_ms": ms(50), "p90_ms": ms(90), "p99_ms": ms(99), "max_ms": ms(100)}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings()
    tenant = settings.tenant(TENANT)
    assert tenant is not None and tenant.inbox_keys
    key = tenant.inbox_keys[0].get_secret_value()
    port = settings.inbox.port
    log_dir = Path(tempfile.mkdtemp(prefix="notiflow-bench-inbox-"))
    server = ManagedProcess("inbox", ["inbox", "--port", str(port)], log_dir).start()
    try:
        server.wait_http(f"http://127.0.0.1:{port}/healthz")
        assert server.proc is not None
        proc = psutil.Process(server.proc.pid)
        rss_idle = proc.memory_info().rss
        run = uuid.uuid4().hex[:6]
        users = users_of(run, args.clients, args.devices)
        parent, child = multiprocessing.get_context("spawn").Pipe()
        clients = multiprocessing.get_context("spawn").Process(target=clients_main, args=(
            f"http://127.0.0.1:{port}/v1/inbox/ws", key, settings.inbox.token_audience,
            users, args.devices, child))
        clients.start()
        started = time.perf_counter()
        _, opened, refused = await asyncio.to_thread(parent.recv)
        connect_s = time.perf_counter() - started
        await asyncio.sleep(2.0)
        rss_connected = proc.memory_info().rss
        cpu_before = sum(proc.cpu_times()[:2])
        provider = await InboxDelivery.open(settings, timeout=5.0)
        peak = rss_connected

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, proc.memory_info().rss)
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch())
        try:
            sent, send_failed = await deliver(provider, users, args.rate, args.seconds,
                                              args.burst)
            await asyncio.sleep(3.0)
        finally:
            watcher.cancel()
            await provider.aclose()
        cpu_s = sum(proc.cpu_times()[:2]) - cpu_before
        parent.send("stop")
        _, arrivals = await asyncio.to_thread(parent.recv)
        await asyncio.to_thread(clients.join, 30)
    finally:
        server.stop()
    by_phase: dict[str, dict[str, list[float]]] = {
        p: {"fanout": [], "end_to_end": []} for p in ("steady", "burst")}
    for mid, published, arrived in arrivals:
        phase, start = sent.get(mid, ("", 0.0))
        if phase:
            by_phase[phase]["fanout"].append(arrived - published)
            by_phase[phase]["end_to_end"].append(arrived - start)
    mb = 1024 * 1024
    return {
        "clients": args.clients, "devices_per_user": args.devices, "users": len(users),
        "connected": opened, "refused": refused, "connect_s": round(connect_s, 1),
        "steady": {"rate_per_s": args.rate, "seconds": args.seconds,
                   "items": sum(1 for p, _ in sent.values() if p == "steady"),
                   "deliveries": len(by_phase["steady"]["fanout"]),
                   "fanout": summary(by_phase["steady"]["fanout"]),
                   "end_to_end": summary(by_phase["steady"]["end_to_end"])},
        "burst": {"items": sum(1 for p, _ in sent.values() if p == "burst"),
                  "deliveries": len(by_phase["burst"]["fanout"]),
                  "fanout": summary(by_phase["burst"]["fanout"]),
                  "end_to_end": summary(by_phase["burst"]["end_to_end"])},
        "expected_deliveries": len(sent) * args.devices, "send_failures": send_failed,
        "server_rss_mb": {"idle": round(rss_idle / mb), "connected": round(rss_connected / mb),
                          "peak": round(peak / mb)},
        "server_rss_kb_per_connection": round((rss_connected - rss_idle) / 1024
                                              / max(opened, 1), 1),
        "server_cpu_s_while_sending": round(cpu_s, 1),
        "_latencies": {p: v["fanout"] for p, v in by_phase.items()},
    }


def markdown(doc: dict[str, Any]) -> str:
    f = doc["figures"]
    rows = []
    for phase in ("steady", "burst"):
        p = f[phase]
        rows.append(f"| {phase} | {p['items']:,} | {p['deliveries']:,} | "
                    f"{p['fanout']['p50_ms']} / {p['fanout']['p90_ms']} / {p['fanout']['p99_ms']}"
                    f" / {p['fanout']['max_ms']} | {p['end_to_end']['p50_ms']} / "
                    f"{p['end_to_end']['p99_ms']} |")
    rss = f["server_rss_mb"]
    return "\n".join([
        f"# Inbox fan-out ({doc['at']})", "",
        f"{f['connected']:,} WebSocket clients connected ({f['refused']} refused) in "
        f"{f['connect_s']} s: {f['users']:,} users, {f['devices_per_user']} devices each.", "",
        "| phase | items | deliveries | fan-out ms p50 / p90 / p99 / max | send start → "
        "arrival ms p50 / p99 |", "|---|---|---|---|---|", *rows, "",
        f"Deliveries expected: {f['expected_deliveries']:,}; send failures: "
        f"{f['send_failures']}. Server RSS: {rss['idle']} MB idle, {rss['connected']} MB with "
        f"every client connected ({f['server_rss_kb_per_connection']} KB per connection), "
        f"{rss['peak']} MB peak; server CPU while sending: "
        f"{f['server_cpu_s_while_sending']} s.", ""])


def plot(latencies: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for phase, values in latencies.items():
        if values:
            ordered = sorted(v * 1000 for v in values)
            ax.plot(ordered, [i / len(ordered) for i in range(len(ordered))], label=phase)
    ax.set_xscale("log")
    ax.set_xlabel("publish → client arrival (ms, log)")
    ax.set_ylabel("share of deliveries")
    ax.set_title("Inbox fan-out to WebSocket clients")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def main(args: argparse.Namespace) -> None:
    env, _ = dev_environment(api_port=1, fakes_port=2)
    env["NOTIFLOW_INBOX__PORT"] = str(free_port())
    os.environ.update({k: v for k, v in env.items() if k not in os.environ})
    figures = await measure(args)
    latencies = figures.pop("_latencies")
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "figures": figures}
    (OUT / "inbox.json").write_text(json.dumps(doc, indent=2))
    (OUT / "inbox.md").write_text(markdown(doc))
    plot(latencies, OUT / "inbox.png")
    print(markdown(doc))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=5000)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--burst", type=int, default=1000)
    asyncio.run(main(parser.parse_args()))
