"""``notiflow chaos``: fault injection against the local stack, one scenario at a time.

Each scenario runs an isolated platform on the running stack (topic prefix, keyspace and
ports of its own: ``bench/harness.py`` ``Phase``): the emulators, both API lanes, the
reconciler, a scheduler and the send flows of P0 and of the scenario's tier (P1, or P2/P3 for
the bulk lane's victims), the client webhook flow with a verifying receiver when the stream
asks for webhooks, an expander when the stream is a campaign (``chaos_campaign.py``), and
toxiproxy in front of Redis, the brokers or Cassandra for the proxy scenarios.
It submits ``messages`` SMS of that tier through its API lane (or as one campaign's rows) at
``rate``/s with P0 OTPs at ``p0_rate``/s beside them (open loop), injects its fault at a
seeded random moment of the submission, undoes it ``hold`` seconds later, waits
for every accepted message to reach a provider and Cassandra to hold its terminal status
(at most ``settle_timeout``), and reports:

- accepted: answered 202 (the stream and P0); refused: no 202 in the end (the stream's
  requests are retried with their key for 30 s, P0 OTPs three times in quick succession: an
  OTP late is useless);
- terminal: accepted messages whose row is in a terminal status;
- failed: terminal without a provider accepting them (FAILED or EXPIRED: they are in the
  dead-letter queue, recoverable);
- lost: accepted messages neither sent nor terminal once the run settled (must be 0); and,
  for a stream that asks for status webhooks, sent messages whose current status was never
  announced to the receiver (``lost_webhooks``, must be 0);
- duplicate sends: provider acceptances beyond the first of a message;
- regressions: rows holding a lower status than one of their recorded events;
- P0 p99 during the fault: accepted_at to the provider's first acceptance, of the OTPs
  accepted from the fault's start to 10 s after it was undone;
- recovered after: from undoing the fault until every message accepted before then (and
  not failed) had reached a provider.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from cassandra.cluster import Session

from notiflow.bench.harness import OtpStream, Phase, wait_until
from notiflow.bench.stats import percentile
from notiflow.bench.webhook_receiver import Receiver
from notiflow.bench.workload import (
    CATEGORY_BY_TIER,
    REGIONS,
    TEMPLATE_IDS,
    TENANT_BY_TIER,
    PhoneFactory,
)
from notiflow.ops.chaos_campaign import campaign_stream
from notiflow.ops.stack import Stack
from notiflow.ops.toxiproxy import Toxiproxy
from notiflow.schemas.enums import TERMINAL_STATUSES, Channel, Status, Tier
from notiflow.schemas.status import rank
from notiflow.settings import Settings


@dataclass
class Run:
    """What a fault acts on: the scenario's platform, and the times it records."""

    phase: Phase
    rng: random.Random
    fault_at: float = 0.0
    undone_at: float = 0.0
    notes: list[str] = field(default_factory=list)
    toxiproxy: Toxiproxy | None = None
    """The proxy between the platform and a store, for the scenarios that go through one."""

    def process(self, name: str) -> Any:
        return next(p for p in self.phase.group.procs if p.name == name)

    def proxy(self) -> Toxiproxy:
        if self.toxiproxy is None:
            raise RuntimeError("this scenario's platform reaches its stores directly")
        return self.toxiproxy

    def stack(self) -> Stack:
        return Stack(self.phase.settings, log=lambda _m: None)


Fault = Callable[[Run], None]


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    inject: Fault
    undo: Fault
    hold: float = 10.0
    tier: Tier = Tier.P1
    """The tier of the stream submitted beside P0's OTPs."""
    webhooks: bool = False
    """The stream asks for status webhooks (the client webhook flow runs, and a receiver
    counts what it announces)."""
    campaign: bool = False
    """The stream is a campaign of the scenario's tier that an expander turns into messages
    (``chaos_campaign.py``), not requests to the API."""
    scheduled_in: float = 0.0
    """Seconds after its submission each stream message is scheduled for (P2/P3: it waits
    in Cassandra until the scheduler publishes it); 0: sent at once."""
    proxied: Literal["redis", "kafka", "cassandra"] | None = None
    """The store every process of the platform reaches through toxiproxy
    (``toxiproxy.py``)."""


def _kill_process(name: str) -> tuple[Fault, Fault]:
    def inject(run: Run) -> None:
        run.process(name).kill()

    def undo(run: Run) -> None:
        proc = run.process(name)
        proc.start()
        if name.startswith("api"):
            port = run.phase.api_port if name == "api" else run.phase.bulk_port
            proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=120)
    return inject, undo


def _stack_signal(kind: str, sig: signal.Signals) -> Fault:
    """``sig`` to every stack component of ``kind`` (all nodes); after a SIGKILL, returns
    once they are gone."""
    def act(run: Run) -> None:
        stack = run.stack()
        hit = [c for c in stack.components() if c.name.split("-")[0] == kind]
        for comp in hit:
            if pid := stack.pid(comp):
                os.killpg(pid, sig)
        if sig == signal.SIGKILL:
            wait_until(lambda: all(stack.pid(c) is None for c in hit), timeout=20,
                       interval=0.2)
    return act


def _toxics(kind: str, streams: tuple[str, ...] = ("downstream",),
            **attributes: int) -> tuple[Fault, Fault]:
    """A toxiproxy toxic on each of the platform's proxied paths (to Redis, to each broker
    or to Cassandra), on each of ``streams``."""
    def inject(run: Run) -> None:
        proxy = run.proxy()
        for name in proxy.names():
            for stream in streams:
                proxy.add(name, f"chaos-{stream}", kind, stream, **attributes)

    def undo(run: Run) -> None:
        proxy = run.proxy()
        for name in proxy.names():
            for stream in streams:
                proxy.remove(name, f"chaos-{stream}")
    return inject, undo


def _stack_up(run: Run) -> None:
    run.stack().up()


def _provider(knobs: dict[str, Any], names: tuple[str, ...] = ("twilio", "vonage")) -> Fault:
    def act(run: Run) -> None:
        for name in names:
            r = run.phase.admin.post(f"{run.phase.fakes}/_admin/{name}/config", json=knobs)
            r.raise_for_status()
    return act


_HEALTHY = {"outage": False, "error_rate_5xx": 0.0, "error_rate_429": 0.0,
            "timeout_rate": 0.0}

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("kill-send-p1", "SIGKILL the P1 send flow, start it again",
             *_kill_process("send-p1"), hold=5),
    Scenario("kill-send-p0", "SIGKILL the P0 send flow, start it again",
             *_kill_process("send-p0"), hold=5),
    Scenario("kill-api", "SIGKILL the priority-lane API, start it again",
             *_kill_process("api"), hold=5),
    Scenario("kill-reconciler", "SIGKILL the reconciler, start it again",
             *_kill_process("reconcile"), hold=5),
    Scenario("kill-send-p2", "SIGKILL the P2 send flow under a P2 stream, start it again",
             *_kill_process("send-p2"), hold=5, tier=Tier.P2),
    Scenario("kill-send-p3", "SIGKILL the P3 send flow under a P3 stream, start it again",
             *_kill_process("send-p3"), hold=5, tier=Tier.P3),
    Scenario("kill-scheduler", "SIGKILL the scheduler under a P2 stream scheduled 5 s ahead, "
             "start it again", *_kill_process("scheduler"), hold=5, tier=Tier.P2,
             scheduled_in=5.0),
    Scenario("kill-api-bulk", "SIGKILL the bulk-lane API under a P3 stream, start it again",
             *_kill_process("api-bulk"), hold=5, tier=Tier.P3),
    Scenario("kill-webhooks", "SIGKILL the client webhook flow, start it again",
             *_kill_process("webhooks"), hold=5, webhooks=True),
    Scenario("kill-expander", "SIGKILL the campaign expander mid-campaign, start it again",
             *_kill_process("expander"), hold=5, tier=Tier.P3, campaign=True),
    Scenario("redis-kill", "SIGKILL Redis, `stack up` again",
             _stack_signal("redis", signal.SIGKILL), _stack_up, hold=10),
    Scenario("kafka-restart", "SIGKILL every Kafka broker, `stack up` again",
             _stack_signal("kafka", signal.SIGKILL), _stack_up, hold=10),
    Scenario("cassandra-pause", "SIGSTOP Cassandra for 10 s, then SIGCONT",
             _stack_signal("cassandra", signal.SIGSTOP),
             _stack_signal("cassandra", signal.SIGCONT), hold=10),
    Scenario("cassandra-restart", "SIGKILL every Cassandra node, `stack up` again",
             _stack_signal("cassandra", signal.SIGKILL), _stack_up, hold=10),
    Scenario("cassandra-latency", "20 ms more on every answer from Cassandra (through "
             "toxiproxy)", *_toxics("latency", latency=20), hold=20, proxied="cassandra"),
    Scenario("cassandra-partition", "no byte between the platform and Cassandra either way "
             "(through toxiproxy), connections left open", *_toxics(
                 "timeout", ("upstream", "downstream"), timeout=0), hold=10,
             proxied="cassandra"),
    Scenario("redis-latency", "200 ms more on every answer from Redis (through toxiproxy)",
             *_toxics("latency", latency=200), hold=20, proxied="redis"),
    Scenario("redis-partition", "no byte between the platform and Redis either way "
             "(through toxiproxy), connections left open", *_toxics(
                 "timeout", ("upstream", "downstream"), timeout=0), hold=10,
             proxied="redis"),
    Scenario("kafka-latency", "100 ms more on every answer from Kafka (through toxiproxy)",
             *_toxics("latency", latency=100), hold=20, proxied="kafka"),
    Scenario("kafka-partition", "no byte between the platform and Kafka either way "
             "(through toxiproxy), connections left open", *_toxics(
                 "timeout", ("upstream", "downstream"), timeout=0), hold=10,
             proxied="kafka"),
    Scenario("provider-outage", "both SMS providers answer 503 for 30 s",
             _provider({"outage": True}), _provider(_HEALTHY), hold=30),
    Scenario("provider-429", "both SMS providers answer 429, Retry-After 2 s, to 60 %",
             _provider({"error_rate_429": 0.6, "retry_after_s": 2.0}), _provider(_HEALTHY),
             hold=20),
    Scenario("provider-429-one", "the first-ranked SMS account answers every send 429, "
             "Retry-After 2 s", _provider({"error_rate_429": 1.0, "retry_after_s": 2.0},
                                          ("twilio",)),
             _provider(_HEALTHY, ("twilio",)), hold=20),
    Scenario("provider-5xx", "both SMS providers fail 30 % of sends with 5xx",
             _provider({"error_rate_5xx": 0.3}), _provider(_HEALTHY), hold=20),
    Scenario("provider-hang", "10 % of sends accepted, then no answer for 30 s",
             _provider({"timeout_rate": 0.1, "hang_s": 30.0}), _provider(_HEALTHY),
             hold=20),
)}


RETRY_FOR_S = 30.0


@dataclass
class Report:
    scenario: str
    what: str
    accepted: int
    refused: int
    terminal: int
    failed: int
    """Terminal without a provider ever accepting them (FAILED, EXPIRED...: in the DLQ)."""
    lost: int
    """Neither sent nor terminal once the run settled: what must never happen."""
    duplicate_sends: int
    regressions: int
    lost_webhooks: int | None
    """Stream messages a provider accepted whose current status was never announced to the
    receiver (None: the scenario asks for no webhooks). Statuses are announced in order, and
    one overtaken by a later status already announced is skipped: the client must learn the
    latest."""
    p0_p99_fault_ms: float | None
    p0_fault_samples: int
    recovered_after_s: float | None
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _submit(phase: Phase, tier: Tier, version: int, count: int, rate: float, key: str,
                  phones: PhoneFactory, webhook: str | None = None, scheduled_in: float = 0.0,
                  ) -> tuple[dict[str, float], int]:
    """``count`` SMS of ``tier`` at ``rate``/s through its API lane, open loop (each
    scheduled ``scheduled_in`` seconds ahead when that is not 0); message_id →
    accepted_at, and the refused. A request is retried with its key for ``RETRY_FOR_S``
    after a dropped connection, a 429 or a 503 (as ``notiflow.client`` does); refused: any
    other answer, or none by then."""
    accepted: dict[str, float] = {}
    refused = 0
    tenant = TENANT_BY_TIER[tier]
    base = phase.api if tier in (Tier.P0, Tier.P1) else phase.bulk_api
    async with httpx.AsyncClient(base_url=base, headers=phase.auth(tenant),
                                 timeout=30) as client:
        async def one(i: int) -> None:
            nonlocal refused
            body = {"channel": "SMS", "tier": tier.value, "recipient": phones.take(),
                    "category": CATEGORY_BY_TIER[tier].value,
                    "template_id": TEMPLATE_IDS[Channel.SMS], "template_version": version,
                    "variables": {"brand": "Notiflow", "headline": "order", "code": f"{i:06d}"}}
            if webhook is not None:
                body["status_webhook"] = webhook
            if scheduled_in:
                due = datetime.now(UTC) + timedelta(seconds=scheduled_in)
                body["scheduled_at"] = due.isoformat()
            deadline = time.monotonic() + RETRY_FOR_S
            while time.monotonic() < deadline:
                try:
                    r = await client.post("/v1/messages", json=body,
                                          headers={"Idempotency-Key": f"{key}-{i}"})
                except httpx.HTTPError:
                    await asyncio.sleep(1.0)
                    continue
                if r.status_code == 202:
                    doc = r.json()
                    accepted[doc["message_id"]] = datetime.fromisoformat(
                        doc["accepted_at"]).timestamp()
                    return
                if r.status_code in (429, 503):
                    await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                    continue
                break
            refused += 1

        t0, tasks = time.monotonic(), []
        for i in range(count):
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(max(0.0, t0 + (i + 1) / rate - time.monotonic()))
        await asyncio.gather(*tasks)
    return accepted, refused


def regressions(cql: Session, ids: list[str]) -> list[str]:
    """Messages whose row holds a lower status rank than one of their recorded events (or no
    row at all): a status change acknowledged and then lost (whatever order the events'
    clocks put them in, the row keeps the highest rank)."""
    rows = cql.prepare("SELECT status_rank FROM messages WHERE message_id = ?")
    events = cql.prepare("SELECT status, attempt FROM message_events WHERE message_id = ?")
    bad = []
    for mid in ids:
        row = cql.execute(rows, (mid,)).one()
        ranks = [rank(Status(e["status"]), e["attempt"] or 0)
                 for e in cql.execute(events, (mid,))]
        if row is None or (ranks and row["status_rank"] < max(ranks)):
            bad.append(mid)
    return bad


def statuses(cql: Session, ids: list[str]) -> dict[str, str | None]:
    """message_id → its row's status (None: no row)."""
    stmt = cql.prepare("SELECT status FROM messages WHERE message_id = ?")
    futures = {mid: cql.execute_async(stmt, (mid,)) for mid in ids}
    out: dict[str, str | None] = {}
    for mid, fut in futures.items():
        row = fut.result().one()
        out[mid] = row["status"] if row is not None else None
    return out


def settled(accepted: Iterable[str], sends: dict[str, list[float]],
            status: dict[str, str | None], *, recorded: bool = False) -> bool:
    """Whether every accepted message reached a provider or a terminal status; with
    ``recorded``, also whether Cassandra holds a terminal status for every one a provider
    accepted (the reconciler caught up: a store that came back late is measured after it
    did, not while its writes are still being retried)."""
    return all(status.get(m) in TERMINAL if recorded or m not in sends else True
               for m in accepted)


TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)


def measure(scenario: Scenario, run: Run, stream: dict[str, float], p0: dict[str, float],
            refused: int, sends: dict[str, list[float]], status: dict[str, str | None],
            regressed: int, announced: dict[str, set[str]] | None = None) -> Report:
    """The report of one run from what was accepted (message_id → accepted_at), what the
    providers accepted, what Cassandra holds (each message's status) and, when the stream
    asked for webhooks, the statuses ``announced`` of each message."""
    accepted = {**stream, **p0}
    first = {mid: min(times) for mid, times in sends.items() if mid in accepted}
    lost_webhooks = None if announced is None else len(unannounced(stream, first, status,
                                                                   announced))
    unsent = [m for m in accepted if m not in first]
    failed = [m for m in unsent if status.get(m) in TERMINAL]
    window = [mid for mid, at in p0.items() if run.fault_at <= at <= run.undone_at + 10]
    latencies = [(first[m] - p0[m]) * 1000 for m in window if m in first]
    undelivered = len(window) - len(latencies)
    if undelivered:
        run.notes.append(f"{undelivered} P0 of the fault window never reached a provider")
    before = [m for m, at in accepted.items() if at <= run.undone_at and m not in failed]
    p99 = percentile(latencies, 99)
    caught_up = None
    if before and all(m in first for m in before):
        caught_up = max(0.0, max(first[m] for m in before) - run.undone_at)
    return Report(
        scenario=scenario.name, what=scenario.what, accepted=len(accepted), refused=refused,
        terminal=sum(1 for m in accepted if status.get(m) in TERMINAL), failed=len(failed),
        lost=len(unsent) - len(failed),
        duplicate_sends=sum(len(t) - 1 for m, t in sends.items() if m in accepted),
        regressions=regressed, lost_webhooks=lost_webhooks,
        p0_p99_fault_ms=round(p99, 1) if p99 is not None else None,
        p0_fault_samples=len(latencies), recovered_after_s=(
            round(caught_up, 1) if caught_up is not None else None),
        notes=run.notes)


CAMPAIGN_ENV = {"NOTIFLOW_CAMPAIGNS__BATCH": "50"}
"""The expander's batch (and so its pace's burst): 50 rows, so that a campaign expands
over the whole submission and the fault lands mid-expansion."""


def run_scenario(scenario: Scenario, out: Path, *, messages: int, rate: float,
                 p0_rate: float, seed: int, settle_timeout: float = 300.0,
                 log: Callable[[str], None] = print) -> Report:
    """Run one scenario on a platform of its own (stopped and its topics deleted after)."""
    from notiflow.adapters.cassandra.session import connect

    run_id = uuid.uuid4().hex[:6]
    proxy, env = _proxied(scenario.proxied, out / "logs" / f"{run_id}-toxiproxy", log) \
        if scenario.proxied else (None, {})
    if scenario.campaign:
        env.update(CAMPAIGN_ENV)
    phase = Phase(f"chaos-{scenario.name}", out, run_id, extra_env=env)
    run = Run(phase, random.Random(seed), toxiproxy=proxy)
    receiver = _receiver(phase, scenario)
    try:
        phase.prepare()
        phase.start_platform()
        phase.start_send(Tier.P0)
        phase.start_send(scenario.tier)
        if scenario.campaign:
            phase.start("expander", ["flow", "expander", "--name", f"chaos-{run_id}"],
                        ready="starting expander")
        if receiver is not None:
            receiver.__enter__()
            phase.start("webhooks", ["flow", "webhooks", "--recovery-dir",
                                     str(phase.recovery / "webhooks")], ready="starting")
        versions = phase.templates({TENANT_BY_TIER[Tier.P0], TENANT_BY_TIER[scenario.tier]})
        phones = PhoneFactory(REGIONS, datetime.now(UTC))
        otps = OtpStream(phase, versions, p0_rate, PhoneFactory(REGIONS, datetime.now(UTC),
                                                                start=500_000), f"p0-{run_id}")
        duration = messages / rate
        fault_after = duration * run.rng.uniform(0.2, 0.6)
        result: dict[str, Any] = {}

        def submit() -> None:
            if scenario.campaign:
                result["stream"] = campaign_stream(
                    phase, versions[(TENANT_BY_TIER[scenario.tier], Channel.SMS)], messages,
                    rate, finish_within=duration + settle_timeout)
                return
            result["stream"] = asyncio.run(_submit(
                phase, scenario.tier, versions[(TENANT_BY_TIER[scenario.tier], Channel.SMS)],
                messages, rate, f"{scenario.tier.value.lower()}-{run_id}", phones,
                receiver.url() if receiver is not None else None, scenario.scheduled_in))

        submitter = threading.Thread(target=submit, name="chaos-submit")
        otps.start()
        submitter.start()
        time.sleep(fault_after)
        log(f"{scenario.name}: injecting after {fault_after:.1f} s: {scenario.what}")
        run.fault_at = time.time()
        try:
            scenario.inject(run)
            time.sleep(scenario.hold)
        finally:
            scenario.undo(run)  # a paused Cassandra or a killed Redis is never left behind
        run.undone_at = time.time()
        log(f"{scenario.name}: undone after {run.undone_at - run.fault_at:.1f} s")
        submitter.join()
        p0, p0_refused = otps.stop()
        stream, stream_refused = result["stream"]
        accepted = {**stream, **p0}
        cluster, cql = connect(phase.settings)
        try:
            ids = list(accepted)

            def done() -> bool:
                sends = phase.accepted_sends()
                return settled(ids, sends, statuses(cql, ids), recorded=True)

            if not wait_until(done, timeout=settle_timeout, interval=2.0):
                now = statuses(cql, ids)
                open_ = [f"{m} {now.get(m)}" for m in ids if now.get(m) not in TERMINAL]
                run.notes.append(f"not settled within {settle_timeout:.0f} s: {len(open_)} "
                                 f"not terminal, e.g. {', '.join(open_[:5])}")
            time.sleep(3)
            announced = None if receiver is None else _announced(
                receiver, stream, phase.accepted_sends(), lambda ids: statuses(cql, ids))
            report = measure(scenario, run, stream, p0, stream_refused + p0_refused,
                             phase.accepted_sends(), statuses(cql, ids),
                             len(regressions(cql, ids)), announced)
        finally:
            cluster.shutdown()
        return report
    finally:
        phase.stop()
        if receiver is not None:
            receiver.__exit__(None, None, None)
        if proxy is not None:
            proxy.stop()


def _proxied(store: str, log_dir: Path,
             log: Callable[[str], None]) -> tuple[Toxiproxy, dict[str, str]]:
    """A toxiproxy server with proxies to the stack's ``store`` (Redis, or each broker's
    proxied listener on the port it advertises there), and the environment that sends the
    platform through them."""
    base = Settings()
    proxy = Toxiproxy.start(base.cache_dir.expanduser(), log_dir, log)
    try:
        if store == "redis":
            url = urlsplit(base.redis_url)
            listen = proxy.proxy("redis", f"{url.hostname}:{url.port}")
            return proxy, {"NOTIFLOW_REDIS_URL": url._replace(netloc=listen).geturl()}
        if store == "cassandra":
            if len(base.cassandra_hosts) != 1:
                raise RuntimeError("the Cassandra proxy scenarios need a one-node stack: the "
                                   "driver learns other nodes' addresses from system.peers")
            host, port = proxy.proxy("cassandra", f"{base.cassandra_hosts[0]}:"
                                                  f"{base.cassandra_port}").rsplit(":", 1)
            return proxy, {"NOTIFLOW_CASSANDRA_HOSTS": json.dumps([host]),
                           "NOTIFLOW_CASSANDRA_PORT": port}
        hosts = [hp.rsplit(":", 1)[0] for hp in base.kafka_bootstrap.split(",")]
        listens = [proxy.proxy(f"kafka-{i}", f"{h}:{base.kafka_proxied_port}",
                               listen=f"{h}:{base.kafka_proxy_port}")
                   for i, h in enumerate(hosts, 1)]
        return proxy, {"NOTIFLOW_KAFKA_BOOTSTRAP": ",".join(listens)}
    except BaseException:
        proxy.stop()
        raise


def _receiver(phase: Phase, scenario: Scenario) -> Receiver | None:
    """The stream tenant's webhook endpoint, when the scenario asks for webhooks."""
    if not scenario.webhooks:
        return None
    tenant = phase.settings.tenant(TENANT_BY_TIER[scenario.tier])
    if tenant is None or not tenant.webhook_secrets:
        raise RuntimeError(f"tenant {TENANT_BY_TIER[scenario.tier]} signs no webhooks")
    return Receiver(tenant.webhook_secrets)


ANNOUNCE_WAIT_S = 60.0


def unannounced(stream: Iterable[str], sent: dict[str, Any], status: dict[str, str | None],
                announced: dict[str, set[str]]) -> list[str]:
    """Sent stream messages whose current status was never announced."""
    return [m for m in stream if m in sent and status.get(m) not in announced.get(m, set())]


def _announced(receiver: Receiver, stream: dict[str, float], sends: dict[str, list[float]],
               read: Callable[[list[str]], dict[str, str | None]]) -> dict[str, set[str]]:
    """message_id → the statuses announced to ``receiver``, once every sent stream message's
    current status (``read`` from Cassandra) was, or ``ANNOUNCE_WAIT_S`` passed."""
    sent = [m for m in stream if m in sends]

    def arrived() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for m, s in receiver.seen():
            out.setdefault(m, set()).add(s)
        return out

    wait_until(lambda: not unannounced(sent, sends, read(sent), arrived()),
               timeout=ANNOUNCE_WAIT_S, interval=2.0)
    return arrived()


def table(reports: list[Report]) -> str:
    """The reports as a Markdown table (docs/reliability.md)."""
    head = ("| scenario | accepted | refused | terminal | failed | lost | duplicate sends | "
            "regressions | P0 p99 during fault | recovered after |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for r in reports:
        p99 = f"{r.p0_p99_fault_ms:,.0f} ms ({r.p0_fault_samples})" \
            if r.p0_p99_fault_ms is not None else "—"
        rec = f"{r.recovered_after_s} s" if r.recovered_after_s is not None else "not recovered"
        lost = f"{r.lost}" if r.lost_webhooks is None else \
            f"{r.lost} (webhooks {r.lost_webhooks})"
        rows.append(f"| {r.scenario} | {r.accepted} | {r.refused} | {r.terminal} | "
                    f"{r.failed} | {lost} | "
                    f"{r.duplicate_sends} | {r.regressions} | {p99} | {rec} |")
    return head + "\n".join(rows) + "\n"


def totals(reports: list[Report]) -> Counter[str]:
    c: Counter[str] = Counter()
    for r in reports:
        c.update({"lost": r.lost, "regressions": r.regressions,
                  "lost_webhooks": r.lost_webhooks or 0})
    return c
