"""Client status webhooks on the real stack: ``notiflow flow webhooks`` as a process, in a
namespace of its own, posting to loopback receivers that verify every signature (the tenant
is mid-rotation: every request must carry a valid signature for the new and the old
secret); and one message end to end, from the API through the send flow and the Twilio
emulator's status callbacks.

The process runs at ``NOTIFLOW_TIME_SCALE=2e-5``: the Standard Webhooks schedule (0, 5 s,
5 min, 30 min, 2 h, 5 h, 10 h, 10 h; 27 h 35 min in all) takes about 2 s, and the endpoint
breaker's window (30 s ⇒ 1 s here) and open time (60 s ⇒ 0.05 s here) are widened so that it
takes part."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.client_webhooks import signed_headers
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord
from notiflow.bench.webhook_receiver import Hit, Receiver
from notiflow.devenv import webhook_secret
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import DlqRecord, MessageSnapshot, Receipt
from notiflow.settings import Settings
from tests.helpers import hold, hold_async, produce, read_topic, wait_for
from tests.integration.conftest import ready

pytestmark = pytest.mark.integration

SCALE = 2e-5
SVIX_S = [0, 5, 300, 1800, 7200, 18000, 36000, 36000]
SPAN_S = sum(SVIX_S) * SCALE
TIMEOUT_S = 0.4
RETRY_WAIT_BEFORE_KILL_S = 1.2
"""How long a webhook sits in its retry wait before the process is killed."""
EVENT_STATUSES = ["PROVIDER_ACCEPTED", "SENT", "DELIVERED"]


@dataclass
class Namespace:
    settings: Settings
    env: dict[str, str]
    old: str
    new: str
    log_dir: Path
    recovery: Path
    processes: ProcessGroup

    def flow(self, name: str = "webhooks", recovery: str | None = None) -> ManagedProcess:
        args = ["flow", "webhooks", "--recovery-dir", str(self.recovery / (recovery or name))]
        proc = self.processes.add(ManagedProcess(name, args, self.log_dir, env=self.env))
        return proc.start().wait_until(lambda: ready(proc), timeout=90)


@pytest.fixture(scope="module")
def ns(stack: Settings, log_dir: Path,
       tmp_path_factory: pytest.TempPathFactory) -> Iterator[Namespace]:
    """Topic prefix of its own; tenant ``acme`` signs with a new and an old secret."""
    from notiflow.ops.topics import ensure_topics

    tenants = json.loads(os.environ["NOTIFLOW_TENANTS"])
    acme = next(t for t in tenants if t["id"] == "acme")
    old, new = acme["webhook_secrets"][0], webhook_secret()
    acme["webhook_secrets"] = [new, old]
    prefix = f"{stack.topic_prefix}cwh{uuid.uuid4().hex[:6]}."
    env = {**os.environ, "NOTIFLOW_TOPIC_PREFIX": prefix, "NOTIFLOW_TENANTS": json.dumps(tenants),
           "NOTIFLOW_TIME_SCALE": str(SCALE),
           "NOTIFLOW_CLIENT_WEBHOOKS__TIMEOUT": f"PT{TIMEOUT_S}S",
           "NOTIFLOW_BREAKER__WINDOW": "PT50000S", "NOTIFLOW_BREAKER__OPEN_FOR": "PT2500S"}
    settings = stack.model_copy(update={"topic_prefix": prefix})
    ensure_topics(settings)
    group = ProcessGroup()
    yield Namespace(settings, env, old, new, log_dir / "client-webhooks",
                    tmp_path_factory.mktemp("client-webhooks"), group)
    group.stop_all()


@pytest.fixture(scope="module")
def flow(ns: Namespace) -> ManagedProcess:
    return ns.flow()


def event(ns: Namespace, mid: str, status: str, url: str, attempt: int = 1) -> OutRecord:
    now = datetime.now(UTC)
    snap = {"tenant_id": "acme", "channel": "SMS", "tier": "P1", "category": "transactional",
            "template_id": "otp", "template_version": 1, "recipient_hash": "h",
            "recipient_masked": "+1415*****71", "accepted_at": now.isoformat(),
            "status_webhook": url}
    doc = {"event_id": f"{mid}:{status}:{attempt}", "message_id": mid, "tenant_id": "acme",
           "channel": "SMS", "tier": "P1", "status": status, "attempt": attempt,
           "occurred_at": now.isoformat(), "source": "send.p1", "message": snap}
    return OutRecord(ns.settings.events_topic, mid.encode(), orjson.dumps(doc))


def receipt(ns: Namespace, mid: str, status: Status) -> OutRecord:
    r = Receipt(provider_id="twilio", provider_event_id=f"{mid}:{status.value}",
                provider_message_id=f"SM{mid}", status=status, occurred_at=datetime.now(UTC),
                message_id=mid)
    return OutRecord(ns.settings.receipts_topic, r.provider_message_id.encode(),
                     r.model_dump_json().encode())


def seed_row(settings: Settings, mid: str, url: str) -> None:
    """The message row the API writes at acceptance (receipts carry no URL)."""
    now = datetime.now(UTC)
    snap = MessageSnapshot(tenant_id="acme", channel="SMS", tier="P1",
                           category="transactional", template_id="otp", template_version=1,
                           recipient_hash="h", recipient_masked="+1415*****71",
                           accepted_at=now, status_webhook=url)
    cluster, session = connect(settings)
    try:
        asyncio.run(CassandraStore(session, settings).messages.create_message(
            mid, snap, Status.QUEUED, now))
    finally:
        cluster.shutdown()


def dead_letters(ns: Namespace, ids: set[str]) -> list[DlqRecord]:
    recs = (DlqRecord.model_validate_json(m.value())
            for m in read_topic(ns.settings, ns.settings.webhooks_dlq_topic))
    return [r for r in recs if r.message_id in ids]


def test_every_status_event_is_seen_despite_timeouts_and_errors(
        ns: Namespace, flow: ManagedProcess) -> None:
    """The receiver times out the first try of every webhook and answers the second with a
    500; events (with the URL in their snapshot) and receipts (URL from the message row)
    are each seen at least once, validly signed by both secrets, in status order."""

    async def flaky(hit: Hit) -> int:
        if hit.n == 1:
            await hold_async(TIMEOUT_S + 0.6)
            return 504
        return 500 if hit.n == 2 else 200

    with Receiver([ns.new, ns.old], flaky, require_each=True) as rx:
        url = rx.url("/notiflow/status")
        forged = httpx.post(url, content=b'{"data":{"message_id":"msg_forged"}}',
                            headers=signed_headers([webhook_secret()], "wh_forged",
                                                   int(time.time()), b"{}"))
        assert forged.status_code == 401
        by_event = [f"msg_cwh_ev_{uuid.uuid4().hex}" for _ in range(8)]
        by_receipt = [f"msg_cwh_rc_{uuid.uuid4().hex}" for _ in range(4)]
        for mid in by_receipt:
            seed_row(ns.settings, mid, url)
        records = [event(ns, by_event[0], "RETRY_PENDING", url, attempt=1)]
        records += [event(ns, mid, st, url) for mid in by_event for st in EVENT_STATUSES]
        records += [receipt(ns, mid, st) for mid in by_receipt
                    for st in (Status.SENT, Status.DELIVERED)]
        started = time.monotonic()
        produce(ns.settings, records)
        expected = {(mid, st) for mid in by_event for st in EVENT_STATUSES}
        expected |= {(by_event[0], "RETRY_PENDING")}
        expected |= {(mid, st) for mid in by_receipt for st in ("SENT", "DELIVERED")}
        wait_for(lambda: expected <= rx.seen(), timeout=90,
                 what=f"every status seen (missing {expected - rx.seen()})")
        took = time.monotonic() - started
        assert [h.error for h in rx.hits if not h.valid] == ["no matching signature"]
        for mid in by_event + by_receipt:
            assert rx.first_deliveries(mid) in (EVENT_STATUSES, ["RETRY_PENDING",
                                                                 *EVENT_STATUSES],
                                                ["SENT", "DELIVERED"])
        assert all(n >= 3 for wid, n in rx.counts.items() if wid != "wh_forged")
        assert {h.path for h in rx.hits} == {"/notiflow/status"}
        sample = next(h for h in rx.delivered() if h.message_id == by_receipt[0])
        assert sample.body["type"] == "message.status"
        assert set(sample.body["data"]) == {"message_id", "status", "reason", "attempt",
                                            "occurred_at", "tenant_id"}
        assert sample.body["data"]["tenant_id"] == "acme"
        print(f"\n{len(expected)} status changes, each through a timeout and a 500: all seen "
              f"in {took:.1f}s; {sum(rx.counts.values()) - 1} requests")
    assert dead_letters(ns, set(by_event) | set(by_receipt)) == []


def test_a_permanently_failing_endpoint_ends_in_the_dlq(ns: Namespace,
                                                        flow: ManagedProcess) -> None:
    async def broken(hit: Hit) -> int:
        return 503

    with Receiver([ns.new, ns.old], broken, require_each=True) as rx:
        url = rx.url("/broken")
        ids = {f"msg_cwh_dead_{uuid.uuid4().hex}" for _ in range(3)}
        produce(ns.settings, [event(ns, mid, "DELIVERED", url) for mid in ids])

        def all_dead() -> list[DlqRecord] | None:
            found = dead_letters(ns, ids)
            return found if {d.message_id for d in found} == ids else None

        found = wait_for(all_dead, timeout=90, what="three dead letters")
        assert all(h.valid for h in rx.hits)
    cipher = DlqCipher.from_settings(ns.settings)
    for dl in {d.message_id: d for d in found}.values():
        assert dl.message_id is not None
        wid = f"wh_{dl.message_id}_DELIVERED"
        assert (dl.error_class, dl.category) == ("webhook_exhausted", "unavailable")
        assert dl.headers["webhook_id"] == wid and dl.tenant_id == "acme"
        assert dl.source_topic == ns.settings.events_topic
        assert [a.error_code for a in dl.attempts] == ["503"] * len(SVIX_S)
        assert rx.counts[wid] == len(SVIX_S)
        first, last = dl.attempts[0].started_at, dl.attempts[-1].started_at
        assert last - first >= timedelta(seconds=SPAN_S)
        payload: dict[str, Any] = orjson.loads(cipher.decrypt(dl.payload_encrypted))
        assert payload["url"] == url and payload["webhook_id"] == wid
        assert orjson.loads(payload["body"])["data"]["status"] == "DELIVERED"


def test_a_pending_retry_survives_a_killed_process(ns: Namespace,
                                                   flow: ManagedProcess) -> None:
    """SIGKILL while a webhook waits for its retry; the restarted process (same recovery
    store) delivers it with the same webhook-id."""
    healthy = False

    async def down_until_told(hit: Hit) -> int:
        return 200 if healthy else 503

    with Receiver([ns.new, ns.old], down_until_told, require_each=True) as rx:
        mid = f"msg_cwh_crash_{uuid.uuid4().hex}"
        produce(ns.settings, [event(ns, mid, "SENT", rx.url())])
        wid = f"wh_{mid}_SENT"
        wait_for(lambda: rx.counts[wid] >= 4, timeout=60, what="four failed tries")
        hold(RETRY_WAIT_BEFORE_KILL_S)
        flow.kill()
        healthy = True
        restarted = ns.flow("webhooks-restarted", recovery="webhooks")
        try:
            wait_for(lambda: (mid, "SENT") in rx.seen(), timeout=60, what="delivery")
        finally:
            restarted.stop()
        assert {h.webhook_id for h in rx.hits} == {wid}
    assert dead_letters(ns, {mid}) == []


@pytest.fixture
def slow_twilio_callbacks(fakes: str) -> Iterator[None]:
    """The emulator's status callbacks (SENT, then DELIVERED) come 3 s apart, well after the
    send flow's PROVIDER_ACCEPTED event even on a loaded machine (a status that arrives after
    a later one was announced is skipped by design, see docs/webhooks.md)."""
    before = httpx.get(f"{fakes}/_admin/twilio/config").json()
    httpx.post(f"{fakes}/_admin/twilio/config",
               json={"callbacks_enabled": True, "callback_delay_ms": 3000}).raise_for_status()
    try:
        yield
    finally:
        httpx.post(f"{fakes}/_admin/twilio/config", json={
            k: before[k] for k in ("callbacks_enabled", "callback_delay_ms")})


def test_an_api_message_announces_each_status_change(
        stack: Settings, api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p1: ManagedProcess, processes: ProcessGroup, log_dir: Path, tmp_path: Path,
        slow_twilio_callbacks: None) -> None:
    """``POST /v1/messages`` with a ``status_webhook``: PROVIDER_ACCEPTED (send flow event,
    URL from its snapshot), SENT and DELIVERED (receipts of the emulator's signed callbacks,
    URL from the message row) reach the client, signed with the tenant's secret. The flow
    starts from the beginning of the events and receipts topics, read side by side: until
    it has caught up (a warm-up message announced), a receipt may reach it before the
    event that precedes it, and a status after a later one is skipped by design."""
    tenant = stack.tenant("acme")
    assert tenant is not None
    with Receiver(list(tenant.webhook_secrets)) as rx:
        env = {**os.environ, "NOTIFLOW_TIME_SCALE": str(SCALE)}
        proc = processes.add(ManagedProcess(
            "webhooks-e2e", ["flow", "webhooks", "--recovery-dir", str(tmp_path / "wh")],
            log_dir, env=env)).start()
        proc.wait_until(lambda: ready(proc), timeout=90)

        def send(path: str) -> str:
            r = httpx.post(f"{api}/v1/messages", headers={
                "Authorization": f"Bearer {tokens['acme']}",
                "Idempotency-Key": uuid.uuid4().hex},
                json={"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
                      "template_id": "otp", "template_version": otp_template["acme"],
                      "variables": {"code": "777111"}, "status_webhook": rx.url(path)})
            assert r.status_code == 202, r.text
            return str(r.json()["message_id"])

        try:
            warm = send("/warm-up")
            wait_for(lambda: (warm, "DELIVERED") in rx.seen(), timeout=90,
                     what="the fresh flow caught up with the session's status and receipt "
                          "topics (its warm-up message announced DELIVERED)")
            mid = send("/e2e")
            expected = {(mid, st) for st in EVENT_STATUSES}
            wait_for(lambda: expected <= rx.seen(), timeout=60,
                     what=f"PROVIDER_ACCEPTED, SENT, DELIVERED of {mid}")
        finally:
            proc.stop()
        assert rx.first_deliveries(mid) == EVENT_STATUSES
        assert all(h.valid for h in rx.hits)
        assert "+1415" not in str([h.body for h in rx.hits])


def test_urls_the_egress_rules_refuse_are_dead_lettered_without_a_connection(
        ns: Namespace) -> None:
    """Events written straight to Kafka (never seen by the API) whose ``status_webhook`` leads
    to a metadata, private or IPv4-mapped address end in the DLQ as
    ``webhook_url_not_allowed``, charged to the tenant; a loopback receiver (allowed in the
    dev environment) beside them still gets its webhook. A flow of its own: the module's
    was killed by the crash test."""
    proc = ns.flow("webhooks-egress")
    try:
        _refused_urls_are_dead_lettered(ns)
    finally:
        proc.stop()


def _refused_urls_are_dead_lettered(ns: Namespace) -> None:
    refused = {f"msg_cwh_egress_{i}_{uuid.uuid4().hex}": url for i, url in enumerate((
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://10.0.0.1:9/hook", "http://[::ffff:a9fe:a9fe]/",
        "https://metadata.google.internal/computeMetadata/v1/"))}
    with Receiver([ns.new, ns.old]) as rx:
        fine = f"msg_cwh_egress_ok_{uuid.uuid4().hex}"
        produce(ns.settings, [event(ns, mid, "DELIVERED", url) for mid, url in refused.items()]
                + [event(ns, fine, "DELIVERED", rx.url("/fine"))])

        def all_dead() -> list[DlqRecord] | None:
            found = dead_letters(ns, set(refused))
            return found if {d.message_id for d in found} == set(refused) else None

        found = wait_for(all_dead, timeout=90, what="four dead letters")
        wait_for(lambda: (fine, "DELIVERED") in rx.seen(), timeout=60, what="the fine one")
    assert {(d.error_class, d.category, d.tenant_id) for d in found} == {
        ("webhook_url_not_allowed", "invalid_data", "acme")}
    assert all(d.attempts == () for d in found)


def test_the_api_refuses_a_metadata_status_webhook(
        stack: Settings, api: str, tokens: dict[str, str]) -> None:
    r = httpx.post(f"{api}/v1/messages", headers={"Authorization": f"Bearer {tokens['acme']}"},
                   json={"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
                         "template_id": "otp", "template_version": 1,
                         "variables": {"code": "1"},
                         "status_webhook": "http://169.254.169.254/latest/meta-data"})
    assert r.status_code == 422, r.text
    assert (r.json()["reason"], r.json()["field"]) == ("webhook_url_not_allowed",
                                                       "status_webhook")
