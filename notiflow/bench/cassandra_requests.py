"""What Cassandra and the client spend per message on the reconciler's requests, one request
per message against shared requests (``IN`` reads, multi-message unlogged batches), and on
the API's idempotency reservation (a lightweight transaction) against the same row written
plainly.

``python -m notiflow.bench.cassandra_requests [N]`` needs the local stack up
(``notiflow stack up``); it writes N messages per case with the reconciler's own statements
(``CassandraStore``) and prints, per case, the Cassandra process's CPU and this process's CPU
per message and the rate. Cassandra's CPU includes whatever it does in the background
meanwhile (flushes, compaction): run it on an idle stack, more than once (``bench/README.md``,
"Micro-benchmarks").
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psutil
from cassandra.query import BatchStatement, BatchType, PreparedStatement

from notiflow.adapters.cassandra.messages import rank_write_time
from notiflow.adapters.cassandra.session import Write, aio, connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.schemas.enums import Category, Channel, Status, Tier
from notiflow.schemas.messages import AttemptRecord, MessageSnapshot
from notiflow.schemas.status import rank
from notiflow.settings import Settings

CONCURRENCY = 64
GROUP = 10
"""Messages per shared request."""


def cassandra_process() -> psutil.Process:
    for p in psutil.process_iter(["cmdline"]):
        if any("CassandraDaemon" in c for c in (p.info["cmdline"] or [])):
            return p
    raise SystemExit("no Cassandra process: run `notiflow stack up` first")


def accepted_writes(store: CassandraStore, mid: str, now: datetime) -> list[Write]:
    """The rows the reconciler writes for a message it sees first as PROVIDER_ACCEPTED."""
    snap = MessageSnapshot(
        tenant_id="acme", channel=Channel.SMS, tier=Tier.P2, category=Category.MARKETING,
        template_id="t", template_version=1, recipient_hash="h" * 32,
        recipient_masked="+1415*****71", accepted_at=now, expires_at=now + timedelta(hours=1))
    writes = store.messages.creation_writes(mid, snap, Status.QUEUED, now, "bench")
    r = rank(Status.PROVIDER_ACCEPTED, 1)
    at = rank_write_time(store.messages.created_head(snap, Status.QUEUED, now), r)
    writes.append(("msg_advance", (at, Status.PROVIDER_ACCEPTED.value, r, None, 1, now,
                                   "twilio", f"SM{mid}", None, mid)))
    writes.append(store.messages.event_write(mid, now, f"{mid}:PROVIDER_ACCEPTED:1",
                                             Status.PROVIDER_ACCEPTED, 1, None, "bench", True))
    writes += store.delivery.attempt_writes(mid, AttemptRecord(
        attempt_no=1, provider_id="twilio", outcome="accepted", provider_message_id=f"SM{mid}",
        started_at=now, completed_at=now))
    return writes


def unlogged(stmt: PreparedStatement, rows: Sequence[Sequence[Any]]) -> BatchStatement:
    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
    for row in rows:
        batch.add(stmt, row)
    return batch


async def main(n: int) -> None:
    settings = Settings()
    cluster, session = await asyncio.to_thread(connect, settings)
    store = CassandraStore(session, settings)
    shared = CassandraStore(session, settings).coalesce(max_keys=GROUP, max_rows=8 * GROUP)
    update = session.prepare("UPDATE messages SET status = ?, updated_at = ? "
                             "WHERE message_id = ?")
    plain_reserve = session.prepare(
        "INSERT INTO idempotency (tenant_id, idempotency_key, request_hash, message_id, state, "
        "topic, payload, created_at) VALUES (?, ?, ?, ?, 'PENDING', ?, ?, ?) USING TTL 3600")
    payload = "x" * 600
    cassandra = cassandra_process()
    sem = asyncio.Semaphore(CONCURRENCY)
    now = datetime.now(UTC)

    def ids() -> list[str]:
        return [f"bench-cr-{uuid.uuid4().hex}" for _ in range(n)]

    def groups(keys: list[str]) -> list[list[str]]:
        return [keys[i:i + GROUP] for i in range(0, len(keys), GROUP)]

    async def case(name: str, fn: Callable[[Any], Awaitable[Any]], items: Sequence[Any]
                   ) -> None:
        await asyncio.sleep(1)
        c0, p0, t0 = cassandra.cpu_times(), time.process_time(), time.monotonic()

        async def bounded(x: Any) -> None:
            async with sem:
                await fn(x)

        await asyncio.gather(*(bounded(x) for x in items))
        c1, p1, t1 = cassandra.cpu_times(), time.process_time(), time.monotonic()
        server = (c1.user + c1.system - c0.user - c0.system) * 1000 / n
        print(f"| {name} | {server:.2f} | {(p1 - p0) * 1000 / n:.2f} | {n / (t1 - t0):,.0f} |",
              flush=True)

    single, grouped = ids(), ids()
    print(f"{n} messages per case, {GROUP} per shared request, {CONCURRENCY} requests at once")
    print("| request | Cassandra CPU ms/msg | client CPU ms/msg | msg/s |")
    print("|---|---|---|---|")
    await case("one-row UPDATE (the minimal pipeline's)",
               lambda m: aio(session.execute_async(update, ("PROVIDER_ACCEPTED", now, m))),
               ids())
    await case("head read, absent row", store.messages.head, single)
    await case("head reads, absent rows, IN", lambda g: asyncio.gather(
        *(shared.messages.head(m) for m in g)), groups(grouped))
    await case("a message's 8 rows, one batch per message",
               lambda m: store.write_all(accepted_writes(store, m, now)), single)
    await case(f"{GROUP} messages' rows, one batch",
               lambda g: store.write_all([w for m in g for w in accepted_writes(store, m, now)]),
               groups(grouped))
    await case("idempotency reservation, LWT (the API's, one per key)",
               lambda m: store.idempotency.reserve("bench", m, "h" * 64, m, "topic", payload,
                                                   now), ids())
    await case(f"the same row without IF NOT EXISTS, {GROUP} per batch",
               lambda g: aio(session.execute_async(unlogged(plain_reserve, [
                   ("bench", m, "h" * 64, m, "topic", payload, now) for m in g]))),
               groups(ids()))
    await case("head read, existing row", store.messages.head, single)
    await case("head reads, existing rows, IN", lambda g: asyncio.gather(
        *(shared.messages.head(m) for m in g)), groups(grouped))
    cluster.shutdown()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5000))
