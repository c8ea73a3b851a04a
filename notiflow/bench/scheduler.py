"""``notiflow bench scheduler``: durable scheduling on the local stack, in two phases.

- **failover**: ``failover_n`` rows due over ``window`` seconds, two scheduler processes, one
  SIGKILLed halfway: lost rows, rows published before their ``scheduled_at``, lateness
  (Kafka's record time - due) p50/p99/max, rows published twice.
- **load**: ``n`` rows due at ``rate`` per second, written into ``scheduled_work`` ahead of
  their due times while one scheduler releases them: rows published per second, lateness
  p50/p99/max, and the scheduler's CPU per row and RSS over the run (flat or not).

Rows are valid P3 SMS ingest records whose message id carries the due time
(``msg_s{due_ms}_{i}``), so the lateness of a record read back from Kafka needs its key and
timestamp only. Nothing but the schedulers consumes the topics.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.values import to_ms
from notiflow.adapters.kafka_io import kafka_config
from notiflow.adapters.scheduled_store import ScheduledStore
from notiflow.bench.harness import Phase
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import IngestRecord
from notiflow.schemas.scheduling import ScheduledRow
from notiflow.settings import Settings

WRITE_CONCURRENCY = 128
LEAD_S = 10.0
"""Seconds between the start of a phase's writes and its first due time (the default of
``run``'s ``lead``; at least twice ``scheduling.min_lead``, and long enough to write the
phase's rows)."""


def bench_id(due: datetime, i: int) -> str:
    return f"msg_s{int(due.timestamp() * 1000)}_{i}"


def due_of(message_id: str) -> datetime:
    return datetime.fromtimestamp(int(message_id.split("_")[1].removeprefix("s")) / 1000, UTC)


def make_row(settings: Settings, due: datetime, i: int) -> ScheduledRow:
    due = to_ms(due)
    mid = bench_id(due, i)
    record = IngestRecord.model_validate({
        "message_id": mid, "tenant_id": "mkt", "channel": "SMS", "tier": "P3",
        "recipient": f"+1415555{i % 10000:04d}", "template_id": "promo",
        "template_version": 1, "variables": {"brand": "notiflow", "code": str(i)},
        "accepted_at": datetime.now(UTC), "expires_at": due + timedelta(hours=24),
        "scheduled_at": due})
    rule = settings.scheduling
    return ScheduledRow.waiting(record, due, settings.ingest_topic(Channel.SMS, Tier.P3),
                                record.model_dump_json(exclude_none=True), rule.bucket,
                                rule.shards)


async def write_rows(settings: Settings, start: datetime, n: int, rate: float,
                     log: Callable[[str], None]) -> float:
    """Write ``n`` rows due from ``start`` at ``rate`` per second, each at least
    ``min_lead`` before it is due; returns the writes' duration (s)."""
    cluster, session = await asyncio.to_thread(connect, settings)
    board = ScheduledStore(session, settings)
    sem = asyncio.Semaphore(WRITE_CONCURRENCY)
    lead = settings.scheduling.min_lead.total_seconds() * 2
    t0 = time.monotonic()

    async def one(i: int) -> None:
        due = start + timedelta(seconds=i / rate)
        ahead = (due - datetime.now(UTC)).total_seconds() - lead
        if ahead > 30:
            await asyncio.sleep(ahead - 30)
        async with sem:
            await board.add(make_row(settings, due, i), datetime.now(UTC))

    try:
        for chunk in range(0, n, 10_000):
            await asyncio.gather(*(one(i) for i in range(chunk, min(n, chunk + 10_000))))
            if chunk and chunk % 100_000 == 0:
                log(f"  {chunk:,} rows written")
    finally:
        cluster.shutdown()
    return time.monotonic() - t0


def read_back(settings: Settings, n: int, timeout: float) -> dict[str, list[float]]:
    """Kafka record times (epoch s) of every bench record on the P3 SMS ingest topic, per
    message id, reading until ``n`` distinct ids arrived or ``timeout`` passed."""
    topic = settings.ingest_topic(Channel.SMS, Tier.P3)
    consumer = Consumer(kafka_config(settings, {"group.id": f"bench-sched-{uuid.uuid4().hex}",
                                                "enable.auto.commit": False}))
    seen: dict[str, list[float]] = {}
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        deadline = time.monotonic() + timeout
        while len(seen) < n and time.monotonic() < deadline:
            for m in consumer.consume(10_000, 1.0):
                key = m.key()
                if m.error() or not key:
                    continue
                seen.setdefault(bytes(key).decode(), []).append(m.timestamp()[1] / 1000)
    finally:
        consumer.close()
    return seen


def lateness(seen: dict[str, list[float]], expected: int) -> dict[str, Any]:
    late = sorted(min(ts) - due_of(m).timestamp() for m, ts in seen.items())
    pct = (lambda q: round(late[min(len(late) - 1, int(len(late) * q))], 3)) if late else (
        lambda q: None)
    return {"expected": expected, "published": len(seen), "lost": expected - len(seen),
            "early": sum(1 for x in late if x < -0.005),
            "copies": sum(len(ts) - 1 for ts in seen.values()),
            "lateness_p50_s": pct(0.5), "lateness_p99_s": pct(0.99),
            "lateness_max_s": round(late[-1], 3) if late else None,
            "lateness_mean_s": round(statistics.fmean(late), 3) if late else None}


def failover(out: Path, run_id: str, n: int, window: float, lead: float,
             log: Callable[[str], None]) -> dict[str, Any]:
    phase = Phase("sched-failover", out, run_id)
    phase.prepare()
    try:
        procs = [phase.start(f"scheduler-{x}", ["flow", "scheduler", "--name", x],
                             ready="claimed shard") for x in ("a", "b")]
        start = datetime.now(UTC) + timedelta(seconds=lead)
        asyncio.run(write_rows(phase.settings, start, n, n / window, log))
        log(f"failover: {n} rows due over {window:.0f} s; SIGKILL of scheduler-a at "
            f"{window / 2:.0f} s")
        time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds() + window / 2))
        killed = time.time()
        procs[0].kill()
        time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds() + window))
        seen = read_back(phase.settings, n, 120)
    finally:
        phase.stop()
    return {"n": n, "window_s": window, "killed_at": killed, **lateness(seen, n)}


def load(out: Path, run_id: str, n: int, rate: float, lead: float,
         log: Callable[[str], None]) -> dict[str, Any]:
    phase = Phase("sched-load", out, run_id)
    phase.prepare()
    try:
        sched = phase.start("scheduler", ["flow", "scheduler", "--name", "load"],
                            ready="claimed shard")
        phase.sampler.start()
        t0 = time.time()
        start = datetime.now(UTC) + timedelta(seconds=lead)
        log(f"load: {n:,} rows due at {rate:,.0f}/s from {start:%H:%M:%S}")
        wrote = asyncio.run(write_rows(phase.settings, start, n, rate, log))
        end = start + timedelta(seconds=n / rate)
        time.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()))
        seen = read_back(phase.settings, n, 300)
        t1 = time.time()
        assert sched.proc is not None
    finally:
        phase.stop()
    first = min((min(ts) for ts in seen.values()), default=t0)
    last = max((min(ts) for ts in seen.values()), default=t1)
    cpu = phase.sampler.cpu_between("scheduler", t0, t1)
    return {"n": n, "rate": rate, "write_s": round(wrote, 1),
            "published_per_s": round(len(seen) / max(1e-9, last - first), 1),
            "scheduler_cpu_ms_per_row": round(cpu * 1000 / max(1, len(seen)), 3),
            "scheduler_rss_mb": [round(x, 1) for x in phase.sampler.rss("scheduler")],
            "procs": phase.sampler.table(t0, t1), "slices": slices(seen, start),
            **lateness(seen, n)}


def slices(seen: dict[str, list[float]], start: datetime, width: float = 10.0
           ) -> list[dict[str, float]]:
    """Per ``width`` seconds of due time: rows published and their lateness p99."""
    by: dict[int, list[float]] = {}
    for m, ts in seen.items():
        due = due_of(m).timestamp()
        by.setdefault(int((due - start.timestamp()) // width), []).append(min(ts) - due)
    out = []
    for k in sorted(by):
        late = sorted(by[k])
        out.append({"t_s": k * width, "rows": len(late),
                    "p99_s": round(late[min(len(late) - 1, int(len(late) * 0.99))], 3)})
    return out


def run(out: Path, *, n: int, rate: float, failover_n: int, window: float,
        log: Callable[[str], None], lead: float = LEAD_S) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    return {"bench": "scheduler", "run_id": run_id, "lead_s": lead,
            "failover": failover(out, run_id, failover_n, window, lead, log),
            "load": load(out, run_id, n, rate, lead, log)}
