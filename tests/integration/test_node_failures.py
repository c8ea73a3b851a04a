"""Node failures on the three-node stack (`make test-cluster`): while
P1 and P3 messages are submitted through the API with P0 OTPs at 20/s beside them, one Kafka
broker and one Cassandra node are SIGKILLed, then restarted. Every acknowledged message
reaches a provider, no message's row holds less than its recorded history, every refusal is
a 429 or 503 with ``Retry-After``, P0's latency during the fault is reported, and both nodes
rejoin. Skipped on the one-node stack of `make test`."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.bench.stats import percentile
from notiflow.ops import cluster
from notiflow.ops.chaos import regressions
from notiflow.ops.stack import Stack
from notiflow.settings import Settings
from tests.helpers import (
    SUCCESS,
    accepted_counts,
    hold,
    hold_async,
    received_at,
    report,
    statuses,
    wait_for,
)
from tests.integration.test_kafka_outage import body, kill, submit

pytestmark = [pytest.mark.integration, pytest.mark.disruptive]

MESSAGES = 10_000
P0_RATE = 20.0
FAULT_S = 30.0
TAIL_S = 5.0
"""How long the P0 ticker keeps sending after the bulk submissions finished."""
VICTIM = 2
"""The node killed of each kind: not the Cassandra seed, not the first bootstrap broker."""


class P0Ticker(threading.Thread):
    """POSTs one P0 OTP every ``1 / P0_RATE`` s, open loop (each at its due time, whatever is
    outstanding), until stopped; keeps (due, seconds from due to the answer, status, message
    id)."""

    def __init__(self, api: str, token: str, version: int) -> None:
        super().__init__(daemon=True)
        self.api, self.token, self.version = api, token, version
        self.stopped = threading.Event()
        self.sent: list[tuple[float, float, int, str | None]] = []

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        async with httpx.AsyncClient(base_url=self.api, timeout=60) as client:
            start, i, pending = time.time(), 0, set()
            while not self.stopped.is_set():
                due = start + i / P0_RATE
                await hold_async(due - time.time())
                i += 1
                task = asyncio.ensure_future(self._one(client, due))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)

    async def _one(self, client: httpx.AsyncClient, due: float) -> None:
        try:
            r = await client.post("/v1/messages", json=body("P0", self.version), headers={
                "Authorization": f"Bearer {self.token}", "Idempotency-Key": uuid.uuid4().hex})
        except httpx.HTTPError:
            self.sent.append((due, time.time() - due, 0, None))
            return
        mid = r.json().get("message_id") if r.status_code == 202 else None
        self.sent.append((due, time.time() - due, r.status_code, mid))


def in_sync(settings: Settings) -> bool:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(timeout=10)
    topic = md.topics[settings.ingest_topic("SMS", "P1")]
    return all(len(p.isrs) == settings.kafka_replication_factor
               for p in topic.partitions.values())


def pct(values: list[float], p: int) -> float:
    return percentile(values, p) or float("nan")


@pytest.fixture(scope="session")
def three_nodes(stack: Settings) -> None:
    """Skips before the session's processes start for a test that needs them."""
    if Stack(stack, log=lambda _m: None).nodes < 3:
        pytest.skip("needs the three-node stack (`make test-cluster`)")


@pytest.mark.timeout(1500)
def test_one_broker_and_one_cassandra_node_killed_lose_nothing(
        three_nodes: None, stack: Settings, api: str, tokens: dict[str, str],
        otp_template: dict[str, int], send_p0: Any, send_p1: Any, send_p3: Any,
        fakes: str, cql: Session,
        capsys: pytest.CaptureFixture[str]) -> None:
    local = Stack(stack, log=lambda _m: None)
    version, token = otp_template["acme"], tokens["acme"]
    ticker = P0Ticker(api, token, version)
    ticker.start()
    bodies = [body("P1" if i % 2 else "P3", version) for i in range(MESSAGES)]
    answers: list[tuple[str, httpx.Response, float]] = []
    feeder = threading.Thread(target=lambda: answers.extend(
        asyncio.run(submit(api, token, bodies, concurrency=16))), daemon=True)
    feeder.start()
    wait_for(lambda: len(accepted_counts(fakes)) >= 1000 or None, timeout=300, interval=1.0,
             what="the run under way")

    fault_start = time.time()
    kill(local, [f"kafka-{VICTIM}", f"cassandra-{VICTIM}"])
    hold(FAULT_S)
    Stack(stack, log=lambda _m: None).up()
    fault_end = time.time()
    feeder.join(timeout=900)
    assert not feeder.is_alive(), "the submissions did not finish"
    hold(TAIL_S)
    ticker.stopped.set()
    ticker.join(timeout=60)

    wait_for(lambda: local.cql_nodes_up(tuple(cluster.host(i) for i in (1, 2, 3))) == 3 or None,
             timeout=180, what="Cassandra's ring whole again")
    wait_for(lambda: in_sync(stack) or None, timeout=180, what="every replica in sync")

    codes = Counter(r.status_code for _, r, _ in answers)
    accepted = [r.json()["message_id"] for _, r, _ in answers if r.status_code == 202]
    p0_ids = [mid for _, _, code, mid in ticker.sent if code == 202 and mid]
    ids = accepted + p0_ids
    wait_for(lambda: (lambda st: st if set(st.values()) <= SUCCESS else None)(
        statuses(cql, ids)), timeout=900, interval=5.0,
        what="every acknowledged message provider-accepted")
    counts = accepted_counts(fakes)
    lost = [mid for mid in ids if counts.get(mid, 0) == 0]
    duplicates = sum(counts[mid] - 1 for mid in ids if counts.get(mid, 0) > 1)
    went_back = regressions(cql, ids)

    during = [(due, secs, code, mid) for due, secs, code, mid in ticker.sent
              if fault_start <= due <= fault_end]
    got = received_at(fakes, ids={mid for _, _, _, mid in during if mid})
    e2e = [got[mid] - due for due, _, _, mid in during if mid in got]
    api_s = [secs for _, secs, code, _ in during if code == 202]
    p0_codes = Counter(code for _, _, code, _ in ticker.sent)
    report(capsys, f"node failures (kafka-{VICTIM} and cassandra-{VICTIM} SIGKILLed for "
           f"{FAULT_S:.0f} s, then restarted): {len(accepted)} of {MESSAGES} P1/P3 answered "
           f"202 ({dict(codes)}), P0 {dict(p0_codes)}; lost {len(lost)}, duplicate sends "
           f"{duplicates}, status regressions {len(went_back)}; P0 during the fault "
           f"({fault_end - fault_start:.0f} s from the kills to both nodes healthy again): "
           f"{len(during)} sent, API p99 {pct(api_s, 99) * 1000:.0f} ms, to the provider "
           f"p50 {pct(e2e, 50) * 1000:.0f} ms / p99 {pct(e2e, 99) * 1000:.0f} ms")
    assert not lost
    assert not went_back
    refusals = [r for _, r, _ in answers if r.status_code != 202]
    assert all(r.status_code in (429, 503) and "Retry-After" in r.headers
               for r in refusals), Counter(r.status_code for r in refusals)
