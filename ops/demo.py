"""``notiflow demo``: the whole platform on the embedded local stack, with real traffic.

Brings the stack up, starts the provider emulators, the Messaging API, one send flow per tier
and the reconciler, sends messages through the API, waits until every accepted message has a
terminal status in Cassandra and prints a per-tier report (latency = emulator receipt time
minus ``accepted_at``; one machine, one clock).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from notiflow.devenv import dev_environment, free_port
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.ops.stack import Stack, port_open
from notiflow.schemas.enums import TERMINAL_STATUSES, Status, Tier
from notiflow.settings import Settings

TEMPLATE = "Your {{ brand }} code is {{ code }}. It expires in {{ minutes }} minutes."
INVALID_NUMBER = "+15005550001"
NUMBER_POOL = ["+14155552671", "+12025550143", "+13125550123", "+14165550123", "+525512345678",
               "+5511912345678", "+4915123456789", "+33612345678", "+27821234567",
               "+971501234567", "+919876543210", "+6591234567", "+8613812345678",
               "+819012345678"]


def daytime_numbers(now: datetime | None = None) -> list[str]:
    """Recipients for whom it is daytime now: P2/P3 honour quiet hours (22:00-08:00 local),
    and the demo wants every message to reach a terminal status while it waits."""
    from zoneinfo import ZoneInfo

    from notiflow.flows.consent import phone_timezone

    now = now or datetime.now(UTC)
    picked = []
    for number in NUMBER_POOL:
        zone = phone_timezone(number)
        hour = now.astimezone(ZoneInfo(zone)).hour if zone else 12
        if 9 <= hour < 21:
            picked.append(number)
    return picked
TENANT_BY_TIER = {Tier.P0: "acme", Tier.P1: "acme", Tier.P2: "globex", Tier.P3: "mkt"}
CATEGORY_BY_TIER = {Tier.P0: "otp", Tier.P1: "transactional", Tier.P2: "account",
                    Tier.P3: "marketing"}


@dataclass
class Sent:
    message_id: str
    tier: Tier
    accepted_at: datetime


def _port(preferred: int) -> int:
    return preferred if not port_open(preferred) else free_port()


def unique_recipient(rng: random.Random, numbers: list[str]) -> str:
    """A fresh valid number in a daytime zone (recipient caps such as OTP 5 per 10 minutes
    would otherwise suppress most of the demo's traffic)."""
    import phonenumbers

    base = rng.choice(numbers)
    for _ in range(20):
        candidate = f"{base[:-4]}{rng.randrange(10_000):04d}"
        if phonenumbers.is_valid_number(phonenumbers.parse(candidate, None)):
            return candidate
    return base


async def _templates(api: str, tokens: dict[str, str]) -> dict[str, int]:
    versions = {}
    async with httpx.AsyncClient(base_url=api, timeout=30) as client:
        for tenant in sorted(set(TENANT_BY_TIER.values())):
            r = await client.post("/v1/templates", headers={
                "Authorization": f"Bearer {tokens[tenant]}"}, json={
                "template_id": "demo-code", "channel": "SMS", "body": TEMPLATE})
            r.raise_for_status()
            versions[tenant] = int(r.json()["version"])
    return versions


async def _send_all(api: str, tokens: dict[str, str], versions: dict[str, int], n: int,
                    console: Console, *, invalid_every: int = 37
                    ) -> tuple[list[Sent], Counter[str]]:
    rejected: Counter[str] = Counter()
    sent: list[Sent] = []
    rng = random.Random()
    numbers = daytime_numbers()
    async with httpx.AsyncClient(base_url=api, timeout=30) as client:
        sem = asyncio.Semaphore(16)
        tiers = list(Tier)

        async def one(i: int) -> None:
            tier = tiers[i % 4]
            tenant = TENANT_BY_TIER[tier]
            invalid = invalid_every and i % invalid_every == 5
            recipient = INVALID_NUMBER if invalid else unique_recipient(rng, numbers)
            body = {"channel": "SMS", "tier": tier.value, "recipient": recipient,
                    "template_id": "demo-code", "template_version": versions[tenant],
                    "category": CATEGORY_BY_TIER[tier],
                    "variables": {"brand": "Notiflow", "code": f"{rng.randrange(10**6):06d}",
                                  "minutes": 5}}
            async with sem:
                resp = await client.post("/v1/messages", json=body, headers={
                    "Authorization": f"Bearer {tokens[tenant]}",
                    "Idempotency-Key": f"demo-{time.time_ns()}-{i}"})
            if resp.status_code != 202:
                rejected[f"{resp.status_code} {resp.json().get('error')}"] += 1
                return
            doc = resp.json()
            sent.append(Sent(doc["message_id"], tier,
                             datetime.fromisoformat(doc["accepted_at"])))

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        if n > len(Tier):
            console.print(f"sent {n} requests through the API in "
                          f"{time.perf_counter() - t0:.1f}s: {len(sent)} accepted (202), "
                          f"{sum(rejected.values())} rejected {dict(rejected) or ''}")
    return sent, rejected


async def _wait_terminal(settings: Settings, sent: list[Sent], timeout: float
                         ) -> dict[str, dict[str, Any]]:
    from notiflow.adapters.cassandra_store import CassandraStore, connect

    cluster, session = await asyncio.to_thread(connect, settings)
    store = CassandraStore(session, settings)
    rows: dict[str, dict[str, Any]] = {}
    try:
        deadline = time.monotonic() + timeout
        pending = [s.message_id for s in sent]
        while pending and time.monotonic() < deadline:
            got = await asyncio.gather(*(store.get_message(m) for m in pending))
            for mid, row in zip(pending, got, strict=True):
                if row is not None:
                    rows[mid] = row
            pending = [m for m in pending
                       if m not in rows or Status(rows[m]["status"]) not in TERMINAL_STATUSES]
            if pending:
                await asyncio.sleep(0.5)
    finally:
        cluster.shutdown()
    return rows


def _latencies(fakes: str, sent: list[Sent]) -> dict[str, float]:
    """message_id → ms from acceptance to an emulator's receipt of the first attempt."""
    first: dict[str, float] = {}
    for provider in ("twilio", "vonage"):
        records = httpx.get(f"{fakes}/_admin/{provider}/messages", timeout=30).json()
        for rec in records:
            mid = rec.get("message_id")
            if mid and rec.get("outcome") == "accepted":
                first[mid] = min(first.get(mid, rec["received_at"]), rec["received_at"])
    return {s.message_id: (first[s.message_id] - s.accepted_at.timestamp()) * 1000
            for s in sent if s.message_id in first}


def _pct(values: list[float], p: float) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{statistics.quantiles(values, n=100, method='inclusive')[int(p) - 1]:.0f}"


def report(console: Console, sent: list[Sent], rows: dict[str, dict[str, Any]],
           latency: dict[str, float]) -> int:
    """Print the per-tier table; returns the number of accepted messages not accounted for."""
    table = Table("tier", "accepted", "provider-accepted", "failed", "expired/suppressed",
                  "not terminal", "p50 ms", "p99 ms", "max ms",
                  title="notiflow demo: acceptance → provider acceptance")
    unaccounted = 0
    by_tier: dict[Tier, list[Sent]] = defaultdict(list)
    for s in sent:
        by_tier[s.tier].append(s)
    for tier in Tier:
        items = by_tier.get(tier, [])
        statuses = Counter(rows[s.message_id]["status"] if s.message_id in rows else "MISSING"
                           for s in items)
        ok = sum(statuses[x] for x in ("PROVIDER_ACCEPTED", "SENT", "DELIVERED"))
        other = statuses["EXPIRED"] + statuses["SUPPRESSED"]
        pending = len(items) - ok - statuses["FAILED"] - other
        unaccounted += pending
        lat = sorted(latency[s.message_id] for s in items if s.message_id in latency)
        table.add_row(tier.value, str(len(items)), str(ok), str(statuses["FAILED"]), str(other),
                      str(pending), _pct(lat, 50), _pct(lat, 99),
                      f"{lat[-1]:.0f}" if lat else "-")
    console.print(table)
    return unaccounted


def run_demo(*, messages: int, keep_running: bool, console: Console) -> int:
    env, tokens = dev_environment(api_port=_port(18080), fakes_port=_port(18090))
    os.environ.update(env)
    settings = Settings()
    stack = Stack(settings, log=lambda m: console.print(m, highlight=False))
    was_up = all(healthy for *_, healthy in stack.status())
    stack.up()
    log_dir = settings.stack_dir.resolve() / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    api = f"http://127.0.0.1:{settings.api_port}"
    fakes = f"http://127.0.0.1:{settings.fakes_port}"
    group = ProcessGroup()
    try:
        group.add(ManagedProcess("fakes", ["fakes"], log_dir)).start().wait_http(
            f"{fakes}/_admin/health")
        group.add(ManagedProcess("api", ["api"], log_dir)).start().wait_http(f"{api}/healthz")
        group.add(ManagedProcess("reconcile", ["flow", "reconcile"], log_dir)).start()
        for tier in Tier:
            group.add(ManagedProcess(f"send-{tier.value.lower()}",
                                     ["flow", "send", "--tier", tier.value], log_dir)).start()
        console.print(f"processes started; logs in {log_dir}", highlight=False)
        versions = asyncio.run(_templates(api, tokens))
        warm, _ = asyncio.run(_send_all(api, tokens, versions, len(Tier), console,
                                        invalid_every=0))
        warm_rows = asyncio.run(_wait_terminal(settings, warm, timeout=120))
        if len(warm_rows) < len(warm):
            console.print("[red]the flows did not process the warm-up messages[/red]")
        console.print(f"warm-up: one message per tier, {len(warm_rows)} terminal; "
                      "now the measured run")
        sent, _ = asyncio.run(_send_all(api, tokens, versions, messages, console))
        rows = asyncio.run(_wait_terminal(settings, sent, timeout=180))
        for p in group.procs:
            if not p.alive:
                console.print(f"[red]{p.name} exited[/red]:\n{p.tail()}", highlight=False)
        unaccounted = report(console, sent, rows, _latencies(fakes, sent))
        if sent:
            console.print(f"inspect one: notiflow status {sent[0].message_id}", highlight=False)
        if unaccounted:
            console.print(f"[red]{unaccounted} accepted messages have no terminal status[/red]")
            return 1
        console.print("[green]every accepted message is accounted for[/green]")
        if keep_running:
            console.print(f"API {api}, emulators {fakes}; press Ctrl-C to stop", highlight=False)
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        group.stop_all()
        if not was_up and not keep_running:
            stack.down()
