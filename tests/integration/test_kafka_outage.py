"""The Kafka-outage window on a broker of its own: the broker is SIGKILLed for 60 s while
1,000 P2 messages are submitted; every one is answered 202, P0 in the same outage gets 503,
and after the restart every P2 message reaches a provider.

The broker is private (its own port and data) and so is the keyspace, both made by
:class:`PrivateStack`, as are the API, the P2 send flow and the reconciler that use them;
the Cassandra and Redis servers and the emulators are the session's. So the outage stops
nothing another test uses, and what it leaves behind (a P0 message accepted after the
restart and never sent) is seen by no other test: it runs beside them.

The dataflows do not ride out the broker's death: their Kafka sinks raise on failed
deliveries (by design: progress is never committed past an unconfirmed write) and Bytewax
panics a worker thread, which leaves the process up but stuck. The test plays the supervisor
and restarts the P2 send flow and the reconciler from their recovery stores once Kafka is
back."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.adapters.cassandra.session import connect
from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess, ProcessGroup, stop_together
from notiflow.ops.stack import Stack
from notiflow.ops.topics import ensure_topics
from notiflow.settings import Settings
from tests.helpers import (
    SUCCESS,
    accepted_counts,
    create_template,
    hold,
    report,
    statuses,
    wait_for,
)
from tests.integration.conftest import OTP_TEMPLATE, ready
from tests.integration.test_pipeline import NUMBERS

pytestmark = pytest.mark.integration

OUTAGE_S = 60.0
P2_MESSAGES = 1000


def kill(stack: Stack, names: list[str]) -> None:
    """SIGKILL the stack's components ``names`` and wait until they are gone."""
    comps = [c for c in stack.components() if c.name in names]
    assert len(comps) == len(names), f"no such component among {names}"
    for comp in comps:
        pid = stack.pid(comp)
        assert pid is not None, f"{comp.name} is not running"
        os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: all(stack.pid(c) is None for c in comps), timeout=10,
             what=f"{', '.join(names)} gone")


class PrivateStack:
    """A one-node broker of its own on free loopback ports with the topics, and a keyspace of
    its own on the session's Cassandra; ``env`` points a process at both."""

    def __init__(self, session: Settings, root: Path) -> None:
        port = free_port()
        self.settings = session.model_copy(update={
            "stack_dir": root, "kafka_bootstrap": f"127.0.0.1:{port}",
            "kafka_controller_port": free_port(), "kafka_proxied_port": free_port(),
            "kafka_proxy_port": free_port(), "kafka_heap_mb": 256,
            "kafka_replication_factor": 1, "kafka_min_insync_replicas": 1,
            "topic_prefix": f"{session.topic_prefix}outage.",
            "cassandra_keyspace": f"{session.cassandra_keyspace}_outage"})
        self.stack = Stack(self.settings, log=lambda _m: None, nodes=1, object_store=False)
        self.env = {**os.environ,
                    "NOTIFLOW_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
                    "NOTIFLOW_KAFKA_REPLICATION_FACTOR": "1",
                    "NOTIFLOW_KAFKA_MIN_INSYNC_REPLICAS": "1",
                    "NOTIFLOW_TOPIC_PREFIX": self.settings.topic_prefix,
                    "NOTIFLOW_CASSANDRA_KEYSPACE": self.settings.cassandra_keyspace}

    def start(self) -> None:
        self.stack.start(["kafka"])

    def kill(self) -> None:
        kill(self.stack, ["kafka"])

    def running(self) -> bool:
        return all(self.stack.pid(c) is not None for c in self.stack.components()
                   if c.name == "kafka")


@pytest.fixture(scope="module")
def private_stack(stack: Settings, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[PrivateStack]:
    own = PrivateStack(stack, tmp_path_factory.mktemp("kafka-outage"))
    own.start()
    try:
        ensure_topics(own.settings)
        own.stack.migrate()
        yield own
    finally:
        if own.running():
            own.kill()
        cluster, session = connect(own.settings, keyspace=None)
        try:
            session.execute(f"DROP KEYSPACE IF EXISTS {own.settings.cassandra_keyspace}",
                            timeout=120)
        finally:
            cluster.shutdown()


def body(tier: str, version: int) -> dict[str, Any]:
    return {"channel": "SMS", "tier": tier, "recipient": random.choice(NUMBERS),
            "template_id": "otp", "template_version": version,
            "variables": {"code": uuid.uuid4().hex[:6]}}


async def submit(api: str, token: str, bodies: list[dict[str, Any]],
                 concurrency: int = 32) -> list[tuple[str, httpx.Response, float]]:
    """POST each body with its own key; (key, response, seconds) in order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, b: dict[str, Any]
                  ) -> tuple[str, httpx.Response, float]:
        key = uuid.uuid4().hex
        async with gate:
            started = time.monotonic()
            r = await client.post("/v1/messages", json=b, headers={
                "Authorization": f"Bearer {token}", "Idempotency-Key": key})
            return key, r, time.monotonic() - started

    async with httpx.AsyncClient(base_url=api, timeout=30.0) as client:
        return await asyncio.gather(*(one(client, b) for b in bodies))


@pytest.mark.timeout(900)
def test_kafka_outage_window_accepts_p2_refuses_p0_and_publishes_after_recovery(
        private_stack: PrivateStack, tokens: dict[str, str], fakes: str, log_dir: Path,
        tmp_path: Path, capsys) -> None:
    logs, recovery = log_dir / "kafka-outage", tmp_path / "recovery"
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    group = ProcessGroup()

    def start(name: str, args: list[str], **env: str) -> ManagedProcess:
        return group.add(ManagedProcess(name, args, logs, {**private_stack.env, **env})).start()

    def flow(name: str, args: list[str], store: str) -> ManagedProcess:
        proc = start(name, ["flow", *args, "--recovery-dir", str(recovery / store)])
        return proc.wait_until(lambda: ready(proc), timeout=60)

    try:
        start("api", ["api"], NOTIFLOW_API_PORT=str(port)).wait_http(f"{api}/healthz")
        version = create_template(api, tokens["acme"], template_id="otp", channel="SMS",
                                  body=OTP_TEMPLATE)
        reconciler = flow("reconcile", ["reconcile"], "reconcile")
        sender = flow("send-p2", ["send", "--tier", "P2"], "send-p2")
        for _ in range(30):  # a 503 with Retry-After (e.g. Redis restarted by another test)
            warm = asyncio.run(submit(api, tokens["acme"], [body("P2", version)]))
            if warm[0][1].status_code != 503:
                break
            hold(float(warm[0][1].headers.get("Retry-After", "1")))
        assert warm[0][1].status_code == 202

        private_stack.kill()
        killed = time.monotonic()
        try:
            first = asyncio.run(submit(api, tokens["acme"],
                                       [body("P2", version) for _ in range(P2_MESSAGES // 2)]))
            p0_body = body("P0", version)
            p0 = asyncio.run(submit(api, tokens["acme"], [p0_body]))
            rest = asyncio.run(submit(api, tokens["acme"],
                                      [body("P2", version)
                                       for _ in range(P2_MESSAGES - len(first))]))
            during = time.monotonic() - killed
            ready_answer = httpx.get(f"{api}/readyz", timeout=10)
            assert during < OUTAGE_S, f"submitting took {during:.0f} s, longer than the outage"
            hold(OUTAGE_S - during)
        finally:
            private_stack.start()
        recovered = time.monotonic()
        stop_together([sender, reconciler])
        flow("reconcile-after-outage", ["reconcile"], "reconcile")
        flow("send-p2-after-outage", ["send", "--tier", "P2"], "send-p2")
        cluster, cql = connect(private_stack.settings)
        try:
            check_outage(api, tokens, fakes, cql, first, rest, p0, p0_body, ready_answer,
                         recovered, capsys)
        finally:
            cluster.shutdown()
    finally:
        group.stop_all()


def check_outage(api: str, tokens: dict[str, str], fakes: str, cql: Session,
                 first: list[tuple[str, httpx.Response, float]],
                 rest: list[tuple[str, httpx.Response, float]],
                 p0: list[tuple[str, httpx.Response, float]], p0_body: dict[str, Any],
                 ready: httpx.Response, recovered: float, capsys: Any) -> None:
    """Every P2 answered 202 and provider-accepted after the restart, none lost; P0 refused
    with 503 in under a second and accepted anew once Kafka is back."""
    p2 = first + rest
    codes = Counter(r.status_code for _, r, _ in p2)
    assert codes == {202: P2_MESSAGES}, codes
    slowest = max(s for _, _, s in p2)
    _, p0_response, p0_seconds = p0[0]
    assert p0_response.status_code == 503, p0_response.text
    assert p0_response.json()["reason"] == "kafka_unavailable"
    assert "Retry-After" in p0_response.headers
    assert p0_seconds < 1.0
    assert ready.status_code == 200 and ready.json()["status"] == "degraded", ready.text

    ids = [r.json()["message_id"] for _, r, _ in p2]
    wait_for(lambda: (lambda st: st if set(st.values()) <= SUCCESS else None)(
        statuses(cql, ids)), timeout=300, interval=2.0,
        what="every P2 message provider-accepted after the restart")
    drained = time.monotonic() - recovered
    counts = accepted_counts(fakes)
    lost = [mid for mid in ids if counts.get(mid, 0) == 0]
    duplicates = sum(counts[mid] - 1 for mid in ids if counts.get(mid, 0) > 1)
    assert not lost

    p0_key = p0[0][0]
    again = httpx.post(f"{api}/v1/messages", json=p0_body, timeout=30, headers={
        "Authorization": f"Bearer {tokens['acme']}", "Idempotency-Key": p0_key})
    assert again.status_code == 202, again.text
    assert "Idempotent-Replayed" not in again.headers
    report(capsys, f"kafka outage {OUTAGE_S:.0f} s: {P2_MESSAGES} P2 answered 202 "
           f"(slowest {slowest * 1000:.0f} ms), P0 503 in {p0_seconds * 1000:.0f} ms; all "
           f"{P2_MESSAGES} provider-accepted {drained:.0f} s after the restart, 0 lost, "
           f"{duplicates} duplicate sends")
