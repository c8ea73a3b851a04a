"""``notiflow chaos hostile-tenant``: tenant B's urgent traffic while tenant A attacks.

On a platform of its own (``bench/harness.py`` ``Phase``: topic prefix, ports and processes
of its own, plus the inbox server), tenant B (``acme``) sends P0 OTPs and a P1 SMS stream
through the priority-lane API while tenant A (``globex``) does everything of
``chaos_hostile_attacks.py`` and ``chaos_hostile_forgeries.py`` at once: poison templates,
a batch of messages whose template fails at render time, campaigns naming B's manifest,
status webhooks at private and metadata addresses, forged receipts for B's messages, CHAT to
an endpoint that answers 503, chunked bodies far past every limit, inbox sockets past its
cap, and ingest records claiming B.

The report (:class:`HostileReport`): B's P0 and P1 p99 (accepted_at to the provider's first
acceptance), B's messages accepted, lost (neither sent nor terminal once settled), wrongly
changed (any status but the ones a healthy provider gives: a forged receipt's FAILED, a
cancel by A), the platform processes that exited, A's answers by action and
``"<status> <reason>"``, what became of A's accepted messages, the bodies' bytes written
before the answer, the inbox sockets, and the flows' ``PRODUCER_QUARANTINE`` /
``DLQ_LIMIT_BREACH`` lines. :meth:`HostileReport.violations` lists what breaks the promise.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from cassandra.cluster import Session

from notiflow.bench.campaign import manifest, upload
from notiflow.bench.harness import OtpStream, Phase, wait_until
from notiflow.bench.stats import percentile
from notiflow.bench.workload import REGIONS, TEMPLATE_IDS, PhoneFactory
from notiflow.devenv import free_port
from notiflow.ops import chaos_hostile_attacks as attacks
from notiflow.ops import chaos_hostile_forgeries as forgeries
from notiflow.ops.chaos import TERMINAL, _submit, settled
from notiflow.schemas.enums import Channel, Status, Tier

P0_SLA_MS = 500.0
P1_SLA_MS = 10_000.0
"""P1's SLA (the tier policy's default, accepted to provider)."""
INBOX_CAP = 5_000
"""The inbox's default per-tenant cap (``inbox.max_connections_per_tenant``)."""
MAY_BE_ACCEPTED = ("template ", "send with ", "batch render-bomb", "batch status_webhook "
                   "private", "chat to ", "twilio receipt signed", "vonage receipt signed",
                   "forged ingest")
"""A's actions the platform may take (a template it can only refuse at render, a batch
call, a receipt only the reconciler can judge, a record on a topic): their outcome is
judged after (a FAILED or EXPIRED message, a dropped receipt, a dead letter). Every other
action of A's must be refused with a 4xx."""
ANSWERED = re.compile(r"(2|4)\d\d\b|written\b")
REFUSED = re.compile(r"4\d\d\b")
HEALTHY = frozenset({Status.PROVIDER_ACCEPTED.value, Status.SENT.value,
                     Status.DELIVERED.value})
"""The statuses a B message may end in with healthy providers and no one else's say."""


@dataclass(frozen=True)
class Config:
    """How much of everything one run does."""

    messages: int = 2400
    """B's P1 stream (its rate sets the window: ``messages / rate`` seconds)."""
    rate: float = 20.0
    p0_rate: float = 5.0
    batch: int = 1000
    sockets: int = 12_000
    """A's inbox connection attempts, at ``socket_rate``/s."""
    socket_rate: float = 80.0
    b_sockets: int = 50
    inbox_cap: int | None = None
    """The inbox's per-tenant cap for this run (None: the platform's default)."""
    body_bytes: int = 2 * 2**30
    chat: int = 200
    forged_ingest: int = 120
    settle_timeout: float = 240.0
    warmup: float = 30.0
    """Seconds of B's ordinary P0 and P1 traffic at the window's rates before A starts: the
    traffic a platform in service has had before anyone attacks it. Its messages must not
    be lost or changed like the window's; its latencies and refusals are reported apart
    (they measure the stack's start, not A)."""


SHORT = Config(messages=200, rate=10.0, p0_rate=5.0, batch=300, sockets=300,
               socket_rate=60.0, b_sockets=10, inbox_cap=100, body_bytes=256 * 2**20,
               chat=40, forged_ingest=60, settle_timeout=90.0, warmup=0.0)
"""The test command's version: a few hundred messages, done in under three minutes."""


@dataclass
class HostileReport:
    run_id: str
    config: dict[str, Any]
    window_s: float
    b_accepted: int
    b_refused: int
    b_lost: int
    b_wrongly_changed: int
    b_statuses: dict[str, int]
    p0_p99_ms: float | None
    p0_samples: int
    p1_p99_ms: float | None
    p1_samples: int
    processes_exited: list[str]
    a_answers: dict[str, dict[str, int]]
    a_outcomes: dict[str, dict[str, int]]
    """A's accepted messages by action: ``"<status> <reason>"`` → count."""
    bodies: list[dict[str, Any]]
    inbox: dict[str, int]
    signed_forgeries: int
    receipts_dropped_as_forged: int
    quarantines: list[str]
    dlq_limit_breaches: int
    rss_max_mb: dict[str, float]
    notes: list[str] = field(default_factory=list)
    warmup_refused: int = 0
    warmup_p0_p99_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def violations(self) -> list[str]:
        """Every broken promise: B slowed, lost or changed; a process gone; an A request
        answered 5xx or not at all; a body read past its limit; B's inbox refused; a
        quarantine of B; a tier halted."""
        bad = []
        if self.p0_p99_ms is None or self.p0_p99_ms > P0_SLA_MS:
            bad.append(f"B's P0 p99 {self.p0_p99_ms} ms (SLA {P0_SLA_MS:.0f} ms)")
        if self.p1_p99_ms is None or self.p1_p99_ms > P1_SLA_MS:
            bad.append(f"B's P1 p99 {self.p1_p99_ms} ms (SLA {P1_SLA_MS:.0f} ms)")
        if self.b_lost or self.b_wrongly_changed or self.b_refused:
            bad.append(f"B: {self.b_lost} lost, {self.b_wrongly_changed} wrongly changed, "
                       f"{self.b_refused} refused")
        if self.processes_exited:
            bad.append(f"exited: {', '.join(self.processes_exited)}")
        for action, answers in self.a_answers.items():
            allowed = ANSWERED if action.startswith(MAY_BE_ACCEPTED) else REFUSED
            for answer, n in answers.items():
                if not allowed.match(answer):
                    bad.append(f"A {action}: {n} x {answer}")
        for action, outcomes in self.a_outcomes.items():
            for outcome, n in outcomes.items():
                if outcome.split(" ")[0] in HEALTHY and action != "own sms":
                    bad.append(f"A {action}: {n} x {outcome} (a hostile message was sent)")
        for b in self.bodies:
            if not str(b["status"]).startswith("4") or b["bytes_sent"] > 64 * 2**20:
                bad.append(f"body {b['route']}: {b['status']} after {b['bytes_sent']:,} B")
        cap = self.config["inbox_cap"] or INBOX_CAP
        if self.inbox.get("A 101 opened", 0) > cap:
            bad.append(f"A held {self.inbox['A 101 opened']} inbox sockets (cap {cap})")
        if self.inbox.get("B 101 opened", 0) != self.config["b_sockets"]:
            bad.append(f"B's inbox sockets: {self.inbox}")
        if any("source=tenant:acme" in q for q in self.quarantines):
            bad.append("B quarantined")
        if self.dlq_limit_breaches:
            bad.append(f"{self.dlq_limit_breaches} DLQ_LIMIT_BREACH")
        return bad


async def attack_all(attack: attacks.Attack, ws_base: str) -> None:
    """Every attack of A's at once; one that raises is tallied as crashed."""
    a = attacks
    async with httpx.AsyncClient(base_url=attack.phase.api, timeout=60,
                                 headers=attack.phase.auth(a.TENANT_A)) as client, \
            httpx.AsyncClient(timeout=30) as anonymous:
        steps = {"templates": a.templates_and_batch(attack, client),
                 "webhooks and policy": a.webhooks_and_policy(attack, client),
                 "campaigns": a.campaigns(attack, client), "chat": a.chat(attack, client),
                 "bodies": a.bodies(attack), "inbox": a.inbox(attack, ws_base),
                 "receipts": forgeries.receipts(attack, anonymous),
                 "ingest": asyncio.to_thread(forgeries.forged_ingest, attack)}
        done = await asyncio.gather(*steps.values(), return_exceptions=True)
        for name, outcome in zip(steps, done, strict=True):
            if isinstance(outcome, BaseException):
                attack.tally(f"attack step {name}", f"crashed {outcome!r}"[:200])


def outcomes(cql: Session, ids: list[str]) -> dict[str, tuple[str | None, str | None]]:
    """message_id → (status, reason) of its row."""
    stmt = cql.prepare("SELECT status, reason FROM messages WHERE message_id = ?")
    futures = {m: cql.execute_async(stmt, (m,)) for m in ids}
    out: dict[str, tuple[str | None, str | None]] = {}
    for m, fut in futures.items():
        row = fut.result().one()
        out[m] = (row["status"], row["reason"]) if row is not None else (None, None)
    return out


def sent_rows(cql: Session, ids: list[str]) -> list[dict[str, Any]]:
    """The provider and provider message id of each message that has one."""
    stmt = cql.prepare("SELECT message_id, provider_id, provider_message_id FROM messages "
                       "WHERE message_id = ?")
    rows = [cql.execute(stmt, (m,)).one() for m in ids]
    return [dict(r) for r in rows if r is not None and r["provider_message_id"]]


def send_seed(phase: Phase, tenant: str, version: int, count: int, phones: PhoneFactory,
              key: str, tier: Tier = Tier.P1) -> list[str]:
    """``count`` ordinary SMS of ``tenant`` at ``tier`` before the window (B's are the
    forgeries' targets, A's give A provider message ids of its own; B's P0 ones take the P0
    path once before it is measured)."""
    ids = []
    with httpx.Client(base_url=phase.api, headers=phase.auth(tenant), timeout=30) as c:
        for i in range(count):
            r = c.post("/v1/messages", headers={"Idempotency-Key": f"{key}-{i}"}, json={
                "channel": "SMS", "tier": tier.value, "category": "transactional",
                "recipient": phones.take(), "template_id": TEMPLATE_IDS[Channel.SMS],
                "template_version": version,
                "variables": {"brand": "Notiflow", "headline": "seed", "code": f"{i:06d}"}})
            r.raise_for_status()
            ids.append(str(r.json()["message_id"]))
    return ids


def scan_logs(log_dir: Path) -> tuple[list[str], int, int]:
    """(``PRODUCER_QUARANTINE`` lines, ``DLQ_LIMIT_BREACH`` lines, receipts dropped as
    forged) in the run's process logs."""
    quarantines, breaches, forged = [], 0, 0
    for path in sorted(log_dir.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "PRODUCER_QUARANTINE" in line:
                quarantines.append(f"{path.stem}: {line[line.index('PRODUCER_QUARANTINE'):]}")
            breaches += "DLQ_LIMIT_BREACH" in line
            found = re.search(r"(\d+) receipt\(s\) dropped as forged", line)
            forged += int(found.group(1)) if found else 0
    return quarantines, breaches, forged


def p99(accepted: dict[str, float], first: dict[str, float]) -> tuple[float | None, int]:
    lat = [(first[m] - at) * 1000 for m, at in accepted.items() if m in first]
    value = percentile(lat, 99)
    return (round(value, 1) if value is not None else None), len(lat)


def warm_up(phase: Phase, versions: dict[tuple[str, Channel], int], b_version: int,
            config: Config, run_id: str, now: datetime,
            ) -> tuple[list[str], dict[str, float], int]:
    """B's ordinary traffic for ``config.warmup`` seconds (``Config.warmup``): the ids of
    B's accepted messages, its P0 ones with their acceptance times, and the refused."""
    if config.warmup <= 0:
        return [], {}, 0
    otps = OtpStream(phase, versions, config.p0_rate,
                     PhoneFactory(REGIONS, now, start=400_000), f"w0-{run_id}")
    otps.start()
    p1, p1_refused = asyncio.run(_submit(
        phase, Tier.P1, b_version, round(config.warmup * config.rate), config.rate,
        f"w1-{run_id}", PhoneFactory(REGIONS, now, start=300_000)))
    p0, p0_refused = otps.stop()
    return [*p0, *p1], p0, p0_refused + p1_refused


def run(out: Path, config: Config, *, log: Callable[[str], None] = print) -> HostileReport:
    """One run on a platform of its own (stopped and its topics deleted after)."""
    from notiflow.adapters.cassandra.session import connect

    run_id = uuid.uuid4().hex[:6]
    env: dict[str, str] = {}
    if config.inbox_cap is not None:
        env["NOTIFLOW_INBOX__MAX_CONNECTIONS_PER_TENANT"] = str(config.inbox_cap)
    phase = Phase("chaos-hostile", out, run_id, extra_env=env)
    inbox_port = free_port()
    try:
        phase.prepare()
        phase.start_platform()
        phase.start_send(Tier.P0)
        phase.start_send(Tier.P1)
        phase.start("inbox", ["inbox", "--port", str(inbox_port)],
                    http=f"http://127.0.0.1:{inbox_port}/healthz")
        phase.sampler.start()
        log(f"hostile-tenant {run_id}: platform up ({len(phase.group.procs)} processes)")
        versions = phase.templates({attacks.TENANT_A, attacks.TENANT_B})
        with httpx.Client(base_url=phase.api, headers=phase.auth(attacks.TENANT_A)) as c:
            r = c.post("/v1/templates", json={"template_id": attacks.CHAT_TEMPLATE,
                                              "channel": "CHAT", "body": "{{ text }}"})
            r.raise_for_status()
            versions[(attacks.TENANT_A, Channel.CHAT)] = int(r.json()["version"])
        phase.admin.post(f"{phase.fakes}/_admin/teams/config",
                         json={"outage": True}).raise_for_status()
        now = datetime.now(UTC)
        b_manifest = upload(phase, manifest(20, PhoneFactory(REGIONS, now, start=900_000)),
                            attacks.TENANT_B)
        b_version = versions[(attacks.TENANT_B, Channel.SMS)]
        seeds = send_seed(phase, attacks.TENANT_B, b_version, 10,
                          PhoneFactory(REGIONS, now, start=800_000), f"seed-b-{run_id}")
        seeds += send_seed(phase, attacks.TENANT_B, b_version, 10,
                           PhoneFactory(REGIONS, now, start=820_000), f"seed-b0-{run_id}",
                           Tier.P0)
        own = send_seed(phase, attacks.TENANT_A, versions[(attacks.TENANT_A, Channel.SMS)], 10,
                        PhoneFactory(REGIONS, now, start=850_000), f"seed-a-{run_id}")
        cluster, cql = connect(phase.settings)
        try:
            wait_until(lambda: len(sent_rows(cql, seeds + own)) == len(seeds + own), 60, 1.0)
            targets, a_sent = sent_rows(cql, seeds), sent_rows(cql, own)
            window = config.messages / config.rate
            attack = attacks.Attack(
                phase, versions, window, config.batch, config.sockets, config.socket_rate,
                config.b_sockets, config.body_bytes, config.chat, config.forged_ingest,
                targets, a_sent, b_manifest, phones=PhoneFactory(REGIONS, now, start=600_000))
            attack.messages["own sms"] = own
            otps = OtpStream(phase, versions, config.p0_rate,
                             PhoneFactory(REGIONS, now, start=500_000), f"p0-{run_id}")
            warm, warm_p0, warm_refused = warm_up(phase, versions, b_version, config, run_id,
                                                  now)
            if warm:
                log(f"hostile-tenant {run_id}: warm-up over ({len(warm)} of B's messages)")
            result: dict[str, Any] = {}

            def submit() -> None:
                result["p1"] = asyncio.run(_submit(
                    phase, Tier.P1, b_version, config.messages, config.rate, f"p1-{run_id}",
                    PhoneFactory(REGIONS, now)))

            def hostile() -> None:
                asyncio.run(attack_all(attack, f"ws://127.0.0.1:{inbox_port}"))

            threads = [threading.Thread(target=submit, name="hostile-b"),
                       threading.Thread(target=hostile, name="hostile-a")]
            t0 = time.time()
            otps.start()
            for t in threads:
                t.start()
            threads[0].join()
            p0, p0_refused = otps.stop()
            log(f"hostile-tenant {run_id}: B's window over after {time.time() - t0:.0f} s")
            threads[1].join()
            log(f"hostile-tenant {run_id}: A done after {time.time() - t0:.0f} s")
            p1, p1_refused = result["p1"]
            b_ids = [*p0, *p1, *seeds, *warm]

            def done() -> bool:
                return settled(b_ids, phase.accepted_sends(),
                               {m: s for m, (s, _r) in outcomes(cql, b_ids).items()},
                               recorded=True)

            notes = []
            if not wait_until(done, timeout=config.settle_timeout, interval=2.0):
                notes.append(f"B not settled within {config.settle_timeout:.0f} s")
            time.sleep(3)
            exited = [p.name for p in phase.group.procs if not p.alive]
            sends = phase.accepted_sends()
            first = {m: min(t) for m, t in sends.items()}
            b_rows = outcomes(cql, b_ids)
            a_ids = {a: ids for a, ids in attack.messages.items()}
            a_rows = outcomes(cql, [m for ids in a_ids.values() for m in ids])
        finally:
            cluster.shutdown()
        wait_until(lambda: scan_logs(phase.log_dir)[2] >= attack.signed_forgeries, 20, 1.0)
        quarantines, breaches, forged = scan_logs(phase.log_dir)
        p0_p99, p0_n = p99(p0, first)
        p1_p99, p1_n = p99(p1, first)
        unsent = [m for m in b_ids if m not in first]
        return HostileReport(
            run_id=run_id, config=asdict(config), window_s=round(window, 1),
            b_accepted=len(b_ids), b_refused=p0_refused + p1_refused,
            b_lost=sum(1 for m in unsent if b_rows[m][0] not in TERMINAL),
            b_wrongly_changed=sum(1 for s, _r in b_rows.values() if s not in HEALTHY),
            b_statuses=dict(Counter(str(s) for s, _r in b_rows.values())),
            p0_p99_ms=p0_p99, p0_samples=p0_n, p1_p99_ms=p1_p99, p1_samples=p1_n,
            processes_exited=exited, a_answers=_nest(attack.answers),
            a_outcomes={a: dict(Counter(f"{a_rows[m][0]} {a_rows[m][1] or ''}".strip()
                                        for m in ids)) for a, ids in a_ids.items()},
            bodies=attack.bodies, inbox=dict(attack.inbox),
            signed_forgeries=attack.signed_forgeries, receipts_dropped_as_forged=forged,
            quarantines=quarantines, dlq_limit_breaches=breaches,
            rss_max_mb={n: round(phase.sampler.rss(n)[2], 1) for n in phase.sampler.samples},
            notes=notes, warmup_refused=warm_refused,
            warmup_p0_p99_ms=p99(warm_p0, first)[0] if warm_p0 else None)
    finally:
        phase.stop()


def largest_body(r: HostileReport) -> float:
    """MiB written of the largest body before its answer."""
    return max((b["bytes_sent"] for b in r.bodies), default=0) / 2**20


def _nest(answers: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (action, answer), n in sorted(answers.items()):
        out.setdefault(action, {})[answer] = n
    return out


def markdown(reports: list[HostileReport]) -> str:
    """The runs side by side (``docs/reliability.md``), then each run's A answers."""
    rows = [
        ("B accepted (P0 + P1 + seeds + warm-up)", lambda r: f"{r.b_accepted:,}"),
        ("warm-up: B refused, B P0 p99 (not judged)",
         lambda r: f"{r.warmup_refused}, {r.warmup_p0_p99_ms} ms"),
        ("B refused", lambda r: str(r.b_refused)),
        ("B lost", lambda r: str(r.b_lost)),
        ("B wrongly changed", lambda r: str(r.b_wrongly_changed)),
        ("B P0 p99 (samples)", lambda r: f"{r.p0_p99_ms} ms ({r.p0_samples})"),
        ("B P1 p99 (samples)", lambda r: f"{r.p1_p99_ms} ms ({r.p1_samples})"),
        ("platform processes exited", lambda r: str(len(r.processes_exited))),
        ("A requests not answered 2xx/4xx", lambda r: str(sum(
            n for a in r.a_answers.values() for k, n in a.items()
            if not ANSWERED.match(k)))),
        ("signed forged receipts posted / dropped as forged",
         lambda r: f"{r.signed_forgeries} / {r.receipts_dropped_as_forged}"),
        ("largest body written before the answer", lambda r: f"{largest_body(r):.1f} MiB"),
        ("inbox sockets", lambda r: ", ".join(f"{k}: {v:,}" for k, v in sorted(
            r.inbox.items()))),
        ("quarantines (PRODUCER_QUARANTINE)", lambda r: "; ".join(
            q.split(": ", 1)[1][:80] for q in r.quarantines) or "none"),
        ("DLQ_LIMIT_BREACH", lambda r: str(r.dlq_limit_breaches)),
        ("violations", lambda r: str(len(r.violations()))),
    ]
    head = "| | " + " | ".join(f"run {r.run_id}" for r in reports) + " |\n"
    head += "|---|" + "---|" * len(reports) + "\n"
    body = "".join(f"| {name} | " + " | ".join(cell(r) for r in reports) + " |\n"
                   for name, cell in rows)
    detail = []
    for r in reports:
        detail.append(f"\nRun {r.run_id}, A's answers and what became of A's accepted "
                      "messages:\n\n| action | answers | outcomes |\n|---|---|---|")
        for action in sorted(set(r.a_answers) | set(r.a_outcomes)):
            ans = ", ".join(f"{k} x {v}" for k, v in r.a_answers.get(action, {}).items())
            outs = ", ".join(f"{k} x {v}" for k, v in r.a_outcomes.get(action, {}).items())
            detail.append(f"| {action} | {ans or '—'} | {outs or '—'} |")
    return head + body + "\n".join(detail) + "\n"
