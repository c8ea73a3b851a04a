"""How fast the history archive is written and reported on (``notiflow archive``,
``notiflow report``), on the local stack.

``python -m notiflow.bench.archive_speed [N]`` (default 50,000) seeds N synthetic messages of
one bench tenant's day into Cassandra (a message row, its tenant-day row, three events, one
attempt; every tenth refused once; rows with a one-hour TTL) from a child process, not
measured; then archives that
(day, tenant) to the stack's S3 under a fresh prefix and runs the report with chDB and with
DuckDB. It prints and writes (``bench/results/archive.{json,md}``, the report's PNGs beside
them) the archive's wall time, messages per second and CPU seconds of this process, the Parquet
bytes per message, and each report's wall time; the prefix is deleted afterwards. The
development environment's settings fill what the environment does not set.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from cassandra.concurrent import execute_concurrent_with_args

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.object_store import ObjectStore
from notiflow.devenv import dev_environment
from notiflow.ops.archive_cli import manifests, run_archive
from notiflow.ops.report_cli import build
from notiflow.settings import ArchiveSettings, Settings

DAY = date(2026, 1, 15)
T0 = datetime(2026, 1, 15, 8, 0, tzinfo=UTC)
OUT = Path("bench/results")


def seed(tenant: str, n: int) -> None:
    """N messages of ``tenant`` on :data:`DAY` (rows expire after an hour); run in a child
    process, so the benchmark's peak RSS is the archive's."""
    cluster, session = connect(Settings())
    try:
        def run(cql: str, rows: list[tuple[Any, ...]]) -> None:
            execute_concurrent_with_args(session, session.prepare(cql), rows, concurrency=128,
                                         raise_on_first_error=True)

        ids = [f"msg_bench{tenant}{i}" for i in range(n)]
        run("INSERT INTO messages (message_id, tenant_id, channel, tier, category, "
            "recipient_hash, recipient_masked, status, attempt, provider_id, accepted_at, "
            "created_at, updated_at) VALUES (?, ?, 'SMS', 'P2', 'marketing', ?, ?, "
            "'DELIVERED', 1, 'twilio', ?, ?, ?) USING TTL 3600",
            [(m, tenant, "h" * 32, ("+4179*****67", "+1415****71", "+4420****00")[i % 3],
              T0, T0, T0) for i, m in enumerate(ids)])
        run("INSERT INTO messages_by_tenant_day (tenant_id, day, created_at, message_id, "
            "channel, tier, category) VALUES (?, ?, ?, ?, 'SMS', 'P2', 'marketing') "
            "USING TTL 3600", [(tenant, DAY, T0, m) for m in ids])
        run("INSERT INTO message_events (message_id, occurred_at, event_id, status, attempt, "
            "source, applied) VALUES (?, ?, ?, ?, 1, ?, true) USING TTL 3600",
            [row for i, m in enumerate(ids) for row in (
                (m, T0, "q", "QUEUED", "send"),
                (m, T0 + timedelta(milliseconds=40 + i % 50), "pa", "PROVIDER_ACCEPTED", "send"),
                (m, T0 + timedelta(milliseconds=900 + i % 700), f"twilio:SM{i}:delivered",
                 "DELIVERED", "receipt.twilio"))])
        run("INSERT INTO attempts (message_id, attempt_no, provider_id, outcome, error_code, "
            "started_at, completed_at) VALUES (?, ?, 'twilio', ?, ?, ?, ?) USING TTL 3600",
            [row for i, m in enumerate(ids) for row in (
                ((m, 1, "transient", "http_503", T0, T0), (m, 2, "accepted", None, T0, T0))
                if i % 10 == 0 else ((m, 1, "accepted", None, T0, T0),))])
    finally:
        cluster.shutdown()


async def measure(settings: Settings, tenant: str, n: int, out: Path) -> dict[str, Any]:
    started, cpu = time.perf_counter(), time.process_time()
    [done] = await run_archive(settings, [DAY], [tenant], force=True)
    wall, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    [doc] = [d for d in await manifests(settings) if d["tenant_id"] == tenant]
    size = sum(f["bytes"] for f in doc["files"].values())
    figures: dict[str, Any] = {
        "messages": n, "rows": done.rows, "archive_s": round(wall, 2),
        "archive_messages_per_s": round(n / wall), "archive_cpu_s": round(cpu_s, 2),
        "parquet_bytes": size, "parquet_bytes_per_message": round(size / n, 1),
        "archive_max_rss_mb": _max_rss_mb()}
    for engine in ("chdb", "duckdb"):
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            _, results = await build(settings, DAY, DAY, [tenant], Path(tmp), engine)
            figures[f"report_{engine}_s"] = round(time.perf_counter() - started, 2)
        figures[f"{engine}_latency_by_tier"] = results["latency_by_tier"]
        if engine == "chdb":
            from notiflow.ops import report

            report.plot(results, out / "archive-report")
    figures["max_rss_mb"] = _max_rss_mb()
    return figures


def _max_rss_mb() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def markdown(doc: dict[str, Any]) -> str:
    f = doc["figures"]
    return "\n".join([
        f"# Archive and report ({doc['at']})", "",
        "| messages | archive s | messages/s | CPU s (this process) | Parquet bytes/message "
        "| peak RSS MB after the archive | report chDB s | report DuckDB s | peak RSS MB "
        "after the reports |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {f['messages']:,} | {f['archive_s']} | {f['archive_messages_per_s']:,} | "
        f"{f['archive_cpu_s']} | {f['parquet_bytes_per_message']} | "
        f"{f['archive_max_rss_mb']} | {f['report_chdb_s']} | {f['report_duckdb_s']} | "
        f"{f['max_rss_mb']} |", ""])


async def main(n: int) -> None:
    env, _ = dev_environment(api_port=1, fakes_port=2)
    os.environ.update({k: v for k, v in env.items() if k not in os.environ})
    base = Settings()
    prefix = f"bench-archive-{uuid.uuid4().hex[:8]}"
    settings = base.model_copy(update={"archive": ArchiveSettings(
        uri=f"s3://{base.object_store.bucket}/{prefix}")})
    tenant = f"bench{uuid.uuid4().hex[:6]}"
    print(f"seeding {n:,} messages of {tenant} on {DAY} ...", flush=True)
    started = time.perf_counter()
    child = multiprocessing.get_context("spawn").Process(target=seed, args=(tenant, n))
    child.start()
    await asyncio.to_thread(child.join)
    if child.exitcode != 0:
        raise SystemExit(f"seeding failed ({child.exitcode})")
    print(f"seeded in {time.perf_counter() - started:.1f} s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        figures = await measure(settings, tenant, n, OUT)
    finally:
        store = ObjectStore.bucket(base.object_store.bucket, base.object_store)
        for key in await store.list(prefix):
            await store.delete(key)
    doc = {"at": datetime.now(UTC).isoformat(timespec="seconds"), "figures": figures}
    (OUT / "archive.json").write_text(json.dumps(doc, indent=2, default=str))
    (OUT / "archive.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000))
