"""``notiflow bench outbox``: what one outbox sweep reads after ``n`` accept-and-complete cycles.

Each cycle is what a completed acceptance leaves in the outbox: a row written and deleted (a
tombstone until ``gc_grace_seconds``, 10 days). The same history, spread over ``spread_s``
seconds before now, is written to both layouts: the former ``outbox_pending`` (16 partitions
by shard, read from the oldest row) and ``outbox_buckets`` (partitions by 10-second bucket and
shard, read from the sweeper's cursor). ``pending`` acceptances that crashed before publishing
are then added, old enough to sweep. Reported for each layout: partition reads of one round,
live rows and tombstone cells they scan (Cassandra's query traces, read before the sweep), and
the time of the round; for the buckets, also a sweeper that comes back after ``spread_s`` down
(its cursor at the start of the history), and the real sweep's time and rows published.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from notiflow.adapters.cassandra.idempotency import OUTBOX_SHARDS, OutboxSlot
from notiflow.bench.harness import KEYSPACE, _settings
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

TENANT = "bench-outbox"
_READ = re.compile(r"Read (\d+) live rows? and (\d+) tombstone cells?")


def _history(n: int, start: datetime, spread_s: float) -> Iterator[tuple[int, datetime, str]]:
    step = spread_s / max(1, n)
    for i in range(n):
        yield i % OUTBOX_SHARDS, start + timedelta(seconds=i * step), f"h-{i}"


def _write_history(session: Any, n: int, start: datetime, spread_s: float,
                   log: Callable[[str], None]) -> float:
    from cassandra.concurrent import execute_concurrent
    from cassandra.query import BatchStatement, BatchType

    legacy_add = session.prepare("INSERT INTO outbox_pending (shard, created_at, tenant_id, "
                                 "idempotency_key) VALUES (?, ?, ?, ?)")
    legacy_del = session.prepare("DELETE FROM outbox_pending WHERE shard = ? AND "
                                 "created_at = ? AND tenant_id = ? AND idempotency_key = ?")
    add = session.prepare("INSERT INTO outbox_buckets (bucket, shard, created_at, tenant_id, "
                          "idempotency_key) VALUES (?, ?, ?, ?, ?)")
    delete = session.prepare("DELETE FROM outbox_buckets WHERE bucket = ? AND shard = ? AND "
                             "created_at = ? AND tenant_id = ? AND idempotency_key = ?")
    t0 = time.monotonic()
    chunk: list[tuple[int, datetime, str]] = []

    def batches(stmt: Any, rows: list[tuple[Any, ...]], key: int) -> list[Any]:
        """Unlogged batches of at most 50 statements of one partition each."""
        parts: dict[Any, list[tuple[Any, ...]]] = {}
        for r in rows:
            parts.setdefault(r[:key], []).append(r)
        out = []
        for part in parts.values():
            for k in range(0, len(part), 50):
                b = BatchStatement(batch_type=BatchType.UNLOGGED)
                for r in part[k:k + 50]:
                    b.add(stmt, r)
                out.append(b)
        return out

    def flush() -> None:
        legacy = [(s, at, TENANT, k) for s, at, k in chunk]
        bucketed = [(OutboxSlot.bucket_of(at), s, at, TENANT, k) for s, at, k in chunk]
        for stmt, args, key in ((legacy_add, legacy, 1), (add, bucketed, 2),
                                (legacy_del, legacy, 1), (delete, bucketed, 2)):
            for ok, result in execute_concurrent(
                    session, [(b, ()) for b in batches(stmt, args, key)], concurrency=64):
                if not ok:
                    raise result
        chunk.clear()

    for done, item in enumerate(_history(n, start, spread_s), 1):
        chunk.append(item)
        if len(chunk) == 20_000:
            flush()
            if done % 200_000 == 0:
                log(f"  {done:,} cycles written ({done / (time.monotonic() - t0):,.0f}/s)")
    flush()
    return time.monotonic() - t0


def _traced(session: Any, cql: str, params: tuple[Any, ...]) -> tuple[int, int, float]:
    """(live rows, tombstone cells, ms) of one read, from its query trace."""
    t0 = time.perf_counter()
    rs = session.execute(cql, params, trace=True)
    ms = (time.perf_counter() - t0) * 1000
    live = dead = 0
    trace = rs.get_query_trace(max_wait_sec=10)
    for event in trace.events or ():
        m = _READ.search(event.description or "")
        if m:
            live += int(m.group(1))
            dead += int(m.group(2))
    return live, dead, ms


def _reads(session: Any, reads: list[tuple[str, tuple[Any, ...]]]) -> dict[str, Any]:
    figures = [_traced(session, cql, params) for cql, params in reads]
    return {"reads": len(figures), "live_rows": sum(f[0] for f in figures),
            "tombstones": sum(f[1] for f in figures),
            "max_tombstones_per_read": max((f[1] for f in figures), default=0),
            "read_ms": round(sum(f[2] for f in figures), 1)}


async def _sweep(settings: Settings, cursors: dict[int, int], now: datetime
                 ) -> tuple[int, int, float]:
    from notiflow.gateway.runtime import Runtime
    from notiflow.gateway.sweeper import OutboxSweeper

    rt = Runtime(settings)
    await rt.start()
    try:
        sweeper = OutboxSweeper(rt)
        sweeper.legacy_done = True
        sweeper.cursors = dict(cursors)
        t0 = time.perf_counter()
        done = await sweeper.sweep_once(now)
        return done, sweeper.reads, (time.perf_counter() - t0) * 1000
    finally:
        await rt.close()


def run(*, n: int, pending: int, spread_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    from notiflow.adapters.cassandra.session import connect
    from notiflow.devenv import dev_environment, free_port
    from notiflow.gateway.outbox import MIN_SWEEP_AGE
    from notiflow.ops.stack import Stack

    env, _tokens = dev_environment(
        api_port=free_port(), fakes_port=free_port(),
        extra={"NOTIFLOW_CASSANDRA_KEYSPACE": KEYSPACE,
               "NOTIFLOW_TOPIC_PREFIX": f"bench-outbox-{uuid.uuid4().hex[:6]}-"})
    settings = _settings(env)
    Stack(settings, log=lambda _m: None).init()
    cluster, session = connect(settings)
    try:
        for table in ("outbox_pending", "outbox_buckets", "outbox_cursor"):
            session.execute(f"TRUNCATE {table}", timeout=120)
        now = datetime.now(UTC)
        min_age_s = max(settings.scaled(settings.outbox_sweep_after),
                        MIN_SWEEP_AGE).total_seconds()
        start = now - timedelta(seconds=spread_s + min_age_s + 60)
        log(f"writing {n:,} accept-and-complete cycles to both layouts, spread over "
            f"{spread_s:,.0f} s")
        write_s = _write_history(session, n, start, spread_s, log)
        crashed_at = start + timedelta(seconds=spread_s)
        keys = _pending(session, settings, pending, crashed_at)
        bucket = OutboxSlot.bucket_of(crashed_at)
        last = OutboxSlot.bucket_of(now - timedelta(seconds=min_age_s)) - 2
        legacy = _reads(session, [
            ("SELECT * FROM outbox_pending WHERE shard = %s AND created_at < %s LIMIT 500",
             (shard, now - timedelta(seconds=min_age_s))) for shard in range(OUTBOX_SHARDS)])
        bucket_reads = [("SELECT * FROM outbox_buckets WHERE bucket = %s AND shard = %s "
                         "LIMIT 500", (b, shard))
                        for shard in range(OUTBOX_SHARDS) for b in range(bucket, last + 1)]
        steady = _reads(session, bucket_reads)
        first = OutboxSlot.bucket_of(start)
        catch_up = _reads(session, [
            ("SELECT * FROM outbox_buckets WHERE bucket = %s AND shard = %s LIMIT 500",
             (b, shard)) for shard in range(OUTBOX_SHARDS)
            for b in range(first, min(last, first + 359) + 1)])
        done, reads, sweep_ms = asyncio.run(_sweep(
            settings, dict.fromkeys(range(OUTBOX_SHARDS), bucket), now))
        left = sum(1 for k in keys if session.execute(
            "SELECT state FROM idempotency WHERE tenant_id = %s AND idempotency_key = %s",
            (TENANT, k)).one()["state"] != "ACCEPTED")
    finally:
        cluster.shutdown()
    return {"bench": "outbox", "n": n, "pending": pending, "spread_s": spread_s,
            "write_s": round(write_s, 1), "legacy": legacy, "buckets": steady,
            "buckets_catch_up": catch_up,
            "sweep": {"settled": done, "reads": reads, "ms": round(sweep_ms, 1),
                      "not_accepted_after": left}}


def _pending(session: Any, settings: Settings, count: int, at: datetime) -> list[str]:
    """``count`` acceptances that crashed after writing their outbox rows (both layouts) and
    before publishing: PENDING reservations with their payloads."""
    from notiflow.schemas.messages import IngestRecord

    keys = []
    for i in range(count):
        key, mid = f"p-{i}-{uuid.uuid4().hex[:8]}", f"msg_{uuid.uuid4().hex}"
        record = IngestRecord.model_validate({
            "channel": "SMS", "tier": "P2", "tenant_id": TENANT, "recipient": "+14155550100",
            "template_id": "t", "template_version": 1, "message_id": mid,
            "idempotency_key": key, "accepted_at": at, "expires_at": at + timedelta(hours=4)})
        session.execute(
            "INSERT INTO idempotency (tenant_id, idempotency_key, request_hash, message_id, "
            "state, topic, payload, created_at) VALUES (%s, %s, 'h', %s, 'PENDING', %s, %s, %s)",
            (TENANT, key, mid, settings.ingest_topic(Channel.SMS, Tier.P2),
             record.model_dump_json(exclude_none=True), at))
        shard = i % OUTBOX_SHARDS
        session.execute("INSERT INTO outbox_pending (shard, created_at, tenant_id, "
                        "idempotency_key) VALUES (%s, %s, %s, %s)", (shard, at, TENANT, key))
        session.execute("INSERT INTO outbox_buckets (bucket, shard, created_at, tenant_id, "
                        "idempotency_key) VALUES (%s, %s, %s, %s, %s)",
                        (OutboxSlot.bucket_of(at), shard, at, TENANT, key))
        keys.append(key)
    return keys


def outbox_markdown(doc: dict[str, Any]) -> str:
    rows = [("`outbox_pending` (before): 16 shards from the oldest row", doc["legacy"]),
            ("`outbox_buckets`: a caught-up sweeper (cursor at the pending rows' bucket)",
             doc["buckets"]),
            ("`outbox_buckets`: a sweeper back after the whole history (one round: 360 "
             "buckets per shard)", doc["buckets_catch_up"])]
    sweep = doc["sweep"]
    return "\n".join([
        "# Outbox sweep benchmark", "",
        f"{doc['n']:,} accept-and-complete cycles (a row written and deleted) spread over "
        f"{doc['spread_s']:,.0f} s, written to both layouts in {doc['write_s']} s, then "
        f"{doc['pending']} crashed acceptances (PENDING, outbox row, nothing published). "
        "What one sweep round reads (Cassandra query traces):", "",
        "| layout | partition reads | live rows | tombstone cells | most tombstones in one "
        "read | read time ms |", "|---|---|---|---|---|---|",
        *(f"| {name} | {r['reads']:,} | {r['live_rows']:,} | {r['tombstones']:,} | "
          f"{r['max_tombstones_per_read']:,} | {r['read_ms']:,} |" for name, r in rows), "",
        f"The real sweep (caught up, `OutboxSweeper.sweep_once`): {sweep['settled']} of "
        f"{doc['pending']} crashed acceptances published and settled in {sweep['ms']:,} ms "
        f"over {sweep['reads']} partition reads; {sweep['not_accepted_after']} left "
        "unsettled. Cassandra warns at 1,000 tombstones in one read and fails the read at "
        "100,000.", ""])


def outbox_plot(doc: dict[str, Any], path: Any) -> Any:
    """Tombstone cells scanned by one sweep round, and the most in one read, per layout
    (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["outbox_pending\n(before)", "buckets,\ncaught up", "buckets,\ncatching up"]
    runs = [doc["legacy"], doc["buckets"], doc["buckets_catch_up"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.bar(names, [max(1, r["tombstones"]) for r in runs], color="tab:grey")
    a.set_yscale("log")
    a.set_title("tombstone cells read by one sweep round")
    b.bar(names, [max(1, r["max_tombstones_per_read"]) for r in runs], color="tab:red")
    for y, label in ((1000, "warn"), (100_000, "fail")):
        b.axhline(y, color="black", linestyle="--", linewidth=1)
        b.text(2.4, y, label, va="bottom", ha="right")
    b.set_yscale("log")
    b.set_title("most tombstones in one read")
    fig.suptitle(f"{doc['n']:,} completed acceptances, {doc['pending']} pending")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
