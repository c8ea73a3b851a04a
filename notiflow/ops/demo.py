"""``notiflow demo``: the whole platform on the embedded local stack, with real traffic.

Brings the stack up (Kafka, Cassandra and Redis; not the object store, which none of the
demo's processes uses), starts the provider emulators, the Messaging API, one send flow per tier
and the reconciler, then sends messages through the API in two phases at one rate
(:data:`SEND_RATE`): a warm-up, in waves, until the P0 latency of a wave stops falling (or
:data:`WARMUP_BOUND` seconds have passed), and the measured run. It waits until every accepted
message of both has a terminal status in Cassandra and prints a per-tier report of the
measured run only (latency = emulator receipt time minus ``accepted_at``; one machine, one
clock) against each tier's SLA.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from rich.console import Console

from notiflow.client import ApiError, AsyncClient, RetryPolicy
from notiflow.devenv import dev_environment, free_port
from notiflow.ops.demo_report import (
    WARMUP_BOUND,
    Sent,
    Verdict,
    WarmUp,
    Wave,
    quantile,
    report,
    report_heading,
    terminal,
    tier_rows,
    try_it,
    warmup_summary,
    warmup_verdict,
)
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.ops.stack import Stack
from notiflow.ops.stack.process import port_open
from notiflow.schemas.enums import Status, Tier
from notiflow.settings import Settings

if TYPE_CHECKING:
    from notiflow.adapters.cassandra.store import CassandraStore

SEND_RATE = 20.0
"""Requests per second through the API, warm-up and measured run alike; tiers take turns, so
each tier gets a quarter."""
WAVE_SECONDS = 5.0
"""Length of one warm-up wave at :data:`SEND_RATE`."""
READY_TIMEOUT = 120.0
"""Seconds the flows get to process their first message (process start, consumer join)."""
DRAIN_TIMEOUT = 180.0
"""Seconds every accepted message gets to reach a terminal status after the measured run."""

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

    from notiflow.schemas.preferences import phone_timezone

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


@dataclass(frozen=True)
class Batch:
    """The API's answers to one :func:`_send_all` call; ``seconds`` from the first request
    to the last answer."""

    sent: list[Sent]
    rejected: Counter[str]
    seconds: float

    @property
    def requests(self) -> int:
        return len(self.sent) + sum(self.rejected.values())


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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


async def _send_all(api: str, tokens: dict[str, str], versions: dict[str, int], n: int, *,
                    start: int = 0, rate: float | None = None, invalid_every: int = 37
                    ) -> Batch:
    """Send requests ``start`` .. ``start + n - 1`` (request i is tier ``i % 4``, to an
    invalid number when ``i % invalid_every == 5``), at most 16 in flight and, given
    ``rate``, request i not before ``(i - start) / rate`` seconds after the first."""
    rejected: Counter[str] = Counter()
    sent: list[Sent] = []
    rng = random.Random()
    numbers = daytime_numbers()
    clients = {tenant: AsyncClient(api, token, retry=RetryPolicy(attempts=3))
               for tenant, token in tokens.items()}
    try:
        sem = asyncio.Semaphore(16)
        tiers = list(Tier)
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            if rate:
                await asyncio.sleep(max(0.0, t0 + (i - start) / rate - time.perf_counter()))
            tier = tiers[i % 4]
            tenant = TENANT_BY_TIER[tier]
            invalid = invalid_every and i % invalid_every == 5
            recipient = INVALID_NUMBER if invalid else unique_recipient(rng, numbers)
            body = {"channel": "SMS", "tier": tier.value, "recipient": recipient,
                    "template_id": "demo-code", "template_version": versions[tenant],
                    "category": CATEGORY_BY_TIER[tier],
                    "variables": {"brand": "Notiflow", "code": f"{rng.randrange(10**6):06d}",
                                  "minutes": 5}}
            try:
                async with sem:
                    got = await clients[tenant].send(body)
            except ApiError as exc:
                rejected[f"{exc.status} {exc.error}"] += 1
                return
            sent.append(Sent(got.message_id, tier, got.accepted_at))

        await asyncio.gather(*(one(i) for i in range(start, start + n)))
    finally:
        for c in clients.values():
            await c.aclose()
    return Batch(sent, rejected, time.perf_counter() - t0)


async def _wait_terminal(store: CassandraStore, sent: Sequence[Sent], timeout: float
                         ) -> dict[str, Status]:
    """The latest status of every message of ``sent`` that has one, once all are terminal
    or after ``timeout`` seconds."""
    statuses: dict[str, Status] = {}
    deadline = time.monotonic() + timeout
    pending = [s.message_id for s in sent]
    while pending and time.monotonic() < deadline:
        got = await asyncio.gather(*(store.message(m) for m in pending))
        for mid, row in zip(pending, got, strict=True):
            if row is not None and row.status is not None:
                statuses[mid] = row.current()
        pending = [m for m in pending if not terminal(statuses, m)]
        if pending:
            await asyncio.sleep(0.5)
    return statuses


async def _latencies(fakes: str, sent: Sequence[Sent]) -> dict[str, float]:
    """message_id → ms from acceptance to an emulator's receipt of the first attempt."""
    first: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=fakes, timeout=30) as client:
        for provider in ("twilio", "vonage"):
            records = (await client.get(f"/_admin/{provider}/messages")).json()
            for rec in records:
                mid = rec.get("message_id")
                if mid and rec.get("outcome") == "accepted":
                    first[mid] = min(first.get(mid, rec["received_at"]), rec["received_at"])
    return {s.message_id: (first[s.message_id] - s.accepted_at.timestamp()) * 1000
            for s in sent if s.message_id in first}


async def _warm_up(store: CassandraStore, api: str, fakes: str, tokens: dict[str, str],
                   versions: dict[str, int], console: Console, *, sla_ms: float) -> WarmUp:
    """One message per tier until the flows process it (:data:`READY_TIMEOUT`), then waves
    of :data:`WAVE_SECONDS` at :data:`SEND_RATE`, each drained before the next, until
    :func:`warmup_verdict` says stop. No invalid numbers: the one invalid test number would
    use up its recipient caps and the measured run's would be suppressed, not failed."""
    warm = WarmUp()
    t0 = time.monotonic()

    def add(batch: Batch) -> None:
        warm.sent.extend(batch.sent)
        warm.rejected.update(batch.rejected)
        warm.requests += batch.requests

    probe = await _send_all(api, tokens, versions, len(Tier), invalid_every=0)
    add(probe)
    warm.statuses.update(await _wait_terminal(store, probe.sent, READY_TIMEOUT))
    if not probe.sent or not all(terminal(warm.statuses, s.message_id) for s in probe.sent):
        console.print(f"[red]the flows did not process one message per tier within "
                      f"{READY_TIMEOUT:.0f} s[/red]")
    console.print(f"flows ready after {time.monotonic() - t0:.0f} s; warming up in "
                  f"{WAVE_SECONDS:g} s waves at {SEND_RATE:g} msg/s (at most "
                  f"{WARMUP_BOUND:.0f} s)", highlight=False)
    size = max(len(Tier), round(SEND_RATE * WAVE_SECONDS))
    waves_t0 = time.monotonic()
    while warm.verdict is Verdict.GO_ON:
        w0 = time.monotonic()
        batch = await _send_all(api, tokens, versions, size, start=warm.requests,
                                rate=SEND_RATE, invalid_every=0)
        add(batch)
        remaining = WARMUP_BOUND - (time.monotonic() - waves_t0)
        warm.statuses.update(await _wait_terminal(store, batch.sent, max(remaining, 1.0)))
        p0 = sorted((await _latencies(fakes, [s for s in batch.sent
                                              if s.tier is Tier.P0])).values())
        warm.waves.append(Wave(batch.requests, time.monotonic() - w0,
                               quantile(p0, 50), quantile(p0, 99)))
        warm.verdict = warmup_verdict(warm.waves, time.monotonic() - waves_t0, sla_ms=sla_ms)
    warm.seconds = time.monotonic() - t0
    return warm


@dataclass(frozen=True)
class Traffic:
    """The warm-up, the measured run, the statuses of both (message_id → status), the
    measured run's latencies (message_id → ms) and the load average when it started."""

    warm: WarmUp
    measured: Batch
    statuses: dict[str, Status]
    latency: dict[str, float]
    load: float | None
    versions: dict[str, int]
    """tenant id → version of its ``demo-code`` template."""


async def _traffic(settings: Settings, api: str, fakes: str, tokens: dict[str, str],
                   messages: int, console: Console) -> Traffic:
    versions = await _templates(api, tokens)
    sla = settings.policy(Tier.P0).sla
    from notiflow.ops.inspect import opened_store

    async with opened_store(settings) as store:
        warm = await _warm_up(store, api, fakes, tokens, versions, console,
                              sla_ms=sla.total_seconds() * 1000)
        colour = "" if warm.verdict is Verdict.SETTLED else "yellow"
        line = warmup_summary(warm, sla=sla)
        console.print(f"[{colour}]{line}[/{colour}]" if colour else line, highlight=False,
                      soft_wrap=True)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        measured = await _send_all(api, tokens, versions, messages, start=warm.requests,
                                   rate=SEND_RATE)
        rejected = sum(measured.rejected.values())
        console.print(f"measured run: {measured.requests} requests in {measured.seconds:.1f} s,"
                      f" {len(measured.sent)} accepted (202), {rejected} rejected"
                      + (f" {dict(measured.rejected)}" if rejected else ""), highlight=False)
        unfinished = [s for s in warm.sent if not terminal(warm.statuses, s.message_id)]
        statuses = {**warm.statuses,
                    **await _wait_terminal(store, [*measured.sent, *unfinished],
                                           DRAIN_TIMEOUT)}
    return Traffic(warm, measured, statuses, await _latencies(fakes, measured.sent), load,
                   versions)


@contextmanager
def library_log(path: Path) -> Iterator[Path]:
    """While the demo runs, every log record of its own process goes to ``path`` (INFO and
    up), not to the terminal: without a handler, Python's last resort prints the warnings and
    errors of the libraries it uses (librdkafka's, handed over by confluent-kafka's
    ``logger``; the Cassandra driver's) bare on stderr, in the middle of the first screen.
    A failure still reaches the terminal: as the exception it raises, or the demo's red
    lines; the log says what the libraries saw. Recipients are masked, as in every log."""
    from notiflow.telemetry import TextFormatter

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()


def run_demo(*, messages: int, keep_running: bool, console: Console) -> int:
    """Run the demo; 1 when any accepted message (warm-up or measured) lacks a terminal
    status, else 0. The logs of its processes go to one folder of the stack's logs, this
    process's own to ``demo.log`` there (:func:`library_log`)."""
    env, tokens = dev_environment(api_port=_port(18080), fakes_port=_port(18090))
    os.environ.update(env)
    settings = Settings()
    log_dir = settings.stack_dir.resolve() / "logs" / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    with library_log(log_dir / "demo.log"):
        return _run(settings, tokens, log_dir, messages=messages, keep_running=keep_running,
                    console=console)


def _run(settings: Settings, tokens: dict[str, str], log_dir: Path, *, messages: int,
         keep_running: bool, console: Console) -> int:
    # nothing the demo runs touches the object store (campaign manifests, the history
    # archive): its stack leaves SeaweedFS out, and `make demo` does not build it
    stack = Stack(settings, log=lambda m: console.print(m, highlight=False),
                  object_store=False)
    was_up = all(healthy for *_, healthy in stack.status())
    stack.up()
    api = f"http://127.0.0.1:{settings.api_port}"
    fakes = f"http://127.0.0.1:{settings.fakes_port}"
    group = ProcessGroup()
    try:
        group.add(ManagedProcess("fakes", ["fakes"], log_dir)).start().wait_http(
            f"{fakes}/_admin/health")
        group.add(ManagedProcess("api", ["api"], log_dir)).start().wait_http(f"{api}/healthz")
        group.add(ManagedProcess("reconcile", ["flow", "reconcile"], log_dir)).start()
        group.add(ManagedProcess("scheduler", ["flow", "scheduler"], log_dir)).start()
        for tier in Tier:
            group.add(ManagedProcess(f"send-{tier.value.lower()}",
                                     ["flow", "send", "--tier", tier.value], log_dir)).start()
        console.print(f"processes started; logs in {log_dir}", highlight=False)
        traffic = asyncio.run(_traffic(settings, api, fakes, tokens, messages, console))
        for p in group.procs:
            if not p.alive:
                console.print(f"[red]{p.name} exited[/red]:\n{p.tail()}", highlight=False)
        rows = tier_rows(traffic.measured.sent, traffic.statuses, traffic.latency,
                         {tier: settings.policy(tier).sla for tier in Tier})
        report(console, report_heading(
            requests=traffic.measured.requests, seconds=traffic.measured.seconds,
            warm_requests=traffic.warm.requests, warm_seconds=traffic.warm.seconds,
            cores=_cores(), load=traffic.load), rows)
        sent = traffic.measured.sent
        if sent:
            console.print(f"inspect one: notiflow status {sent[0].message_id}", highlight=False)
        unaccounted = sum(r.not_terminal for r in rows)
        warm_unaccounted = sum(not terminal(traffic.statuses, s.message_id)
                               for s in traffic.warm.sent)
        if unaccounted or warm_unaccounted:
            console.print(f"[red]{unaccounted} measured and {warm_unaccounted} warm-up "
                          "accepted messages have no terminal status[/red]")
            return 1
        console.print("[green]every accepted message (warm-up and measured) is accounted "
                      "for[/green]")
        if keep_running:
            for line in try_it(api, tokens, traffic.versions["acme"], daytime_numbers()[0]):
                console.print(line, highlight=False, soft_wrap=True)
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
