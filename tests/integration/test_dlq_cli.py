"""``notiflow dlq`` on the real stack: dead letters are produced straight into the session's
DLQ topics (payloads encrypted with the session's key), then listed, shown, replayed and
purged through the Typer app; end to end, a send-flow process dead-letters OTPs whose
provider client raises, and the replays are delivered through the provider emulators."""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from collections.abc import Callable, Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from cassandra.cluster import Session
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from cryptography.fernet import Fernet
from typer.testing import CliRunner, Result

from notiflow.adapters.dlq import DepthMonitor, LedgerSession, dlq_depth, watermarks
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.envelope import envelope
from notiflow.adapters.kafka_io import OutRecord, header, make_headers, producer_config
from notiflow.cli import app
from notiflow.devenv import free_port
from notiflow.ops.dlq_cli import dlq_app
from notiflow.ops.procs import ManagedProcess
from notiflow.schemas.enums import Status, Tier
from notiflow.schemas.messages import AttemptRecord, DlqRecord
from notiflow.schemas.status import rank
from notiflow.settings import Settings
from tests.helpers import (
    SMS_PROVIDERS,
    SUCCESS,
    emulator_records,
    message_row,
    produce,
    read_topic,
    received_at,
    signed,
    wait_for,
)
from tests.integration.conftest import Isolated, ready

pytestmark = pytest.mark.integration
PHONE = "+14155552671"
EMAIL = "jane.doe@example.com"


def now() -> datetime:
    return datetime.now(UTC)


def cli(*args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(dlq_app, list(args), env=env)


def rows(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [orjson.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def ingest(tier: Tier = Tier.P1, channel: str = "SMS", *, version: int = 1,
           tenant: str = "acme", **extra: Any) -> dict[str, Any]:
    """An ingest record as the API writes it."""
    accepted = now()
    doc: dict[str, Any] = {
        "channel": channel, "tier": tier.value, "tenant_id": tenant, "template_id": "otp",
        "template_version": version, "recipient": EMAIL if channel == "EMAIL" else PHONE,
        "variables": {"code": "123456"}, "message_id": f"msg_{uuid.uuid4().hex}",
        "accepted_at": accepted.isoformat(),
        "expires_at": (accepted + timedelta(minutes=30)).isoformat(), "attempt": 1}
    doc.update(extra)
    return doc


def attempt(n: int, at: datetime | None = None) -> AttemptRecord:
    at = at or now()
    return AttemptRecord(attempt_no=n, provider_id="twilio", outcome="transient",
                         normalized_error="internal_error:RuntimeError", started_at=at,
                         completed_at=at)


class Dlq:
    """Writes dead letters into a namespace's DLQ topics."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cipher = DlqCipher.from_settings(settings)
        self.producer = Producer(producer_config(settings))

    def record(self, payload: dict[str, Any] | bytes, *, tier: Tier | None = Tier.P1,
               source_topic: str | None = None, reason: str = "retries exhausted",
               error_class: str = "exhausted_unexplained", category: str = "bug",
               failed_at: datetime | None = None,
               attempts: tuple[AttemptRecord, ...] = ()) -> DlqRecord:
        raw = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        doc = payload if isinstance(payload, dict) else {}
        src = source_topic or self.settings.ingest_topic(doc.get("channel", "SMS"),
                                                         tier or Tier.P1)
        return DlqRecord.model_validate(dict(
            dlq_id=uuid.uuid4().hex, tier=tier, reason=reason, error_class=error_class,
            category=category, failed_at=failed_at or now(), source_topic=src,
            source_partition=0, source_offset=42, source_timestamp_ms=None,
            message_id=doc.get("message_id"), tenant_id=doc.get("tenant_id"),
            headers={"schema_version": "1", **{k: v.decode() for k, v in signed(
                self.settings, OutRecord(src, None, raw)).headers}},
            payload_encrypted=self.cipher.encrypt(raw),
            attempts=attempts))

    def put(self, *records: DlqRecord, topic: str | None = None,
            timestamps: list[int] | None = None) -> list[DlqRecord]:
        for i, r in enumerate(records):
            target = topic or self.settings.dlq_topic(r.tier)
            kwargs: dict[str, Any] = {"timestamp": timestamps[i]} if timestamps else {}
            self.producer.produce(target, r.model_dump_json(exclude_none=True).encode(),
                                  (r.message_id or r.dlq_id).encode(),
                                  headers=make_headers(r.message_id or "", r.tenant_id,
                                                       r.tier.value if r.tier else None),
                                  **kwargs)
        assert self.producer.flush(30) == 0
        return list(records)


@pytest.fixture(scope="module")
def dlq(stack: Settings) -> Dlq:
    return Dlq(stack)


@pytest.fixture
def token() -> str:
    """A word unique to the test, put in every reason so filters find only its records."""
    return f"t{uuid.uuid4().hex[:10]}"


def audit_rows(cql: Session, tier: str, dlq_id: str) -> list[dict[str, Any]]:
    days = {now().date(), (now() - timedelta(days=1)).date()}
    found = []
    for day in days:
        found += [r for r in cql.execute("SELECT * FROM dlq_audit WHERE tier = %s AND day = %s",
                                         (tier, day)) if r["dlq_id"] == dlq_id]
    return found


def failed(cql: Session, message_id: str, tier: Tier, attempt: int) -> None:
    """Write the row the reconcile flow leaves after the send flow gave up on a message."""
    cql.execute("INSERT INTO messages (message_id, tenant_id, channel, tier, status, "
                "status_rank, reason, attempt, accepted_at) VALUES (%s, 'acme', 'SMS', %s, "
                "'FAILED', %s, 'retries_exhausted', %s, %s)",
                (message_id, tier.value, rank(Status.FAILED), attempt, now()))


def replayed(settings: Settings, topic: str, dlq_id: str) -> list[Any]:
    return [m for m in read_topic(settings, topic)
            if header(m.headers(), "dlq_replay_of") == dlq_id]


def test_list_filters(dlq: Dlq, stack: Settings, token: str) -> None:
    old = now() - timedelta(hours=2)
    sms = dlq.record(ingest(), reason=f"{token} renderer failed", error_class="render_error")
    email = dlq.record(ingest(channel="EMAIL", tenant="globex"), reason=f"{token} bad",
                       error_class="validation", category="invalid_data")
    p2 = dlq.record(ingest(Tier.P2), tier=Tier.P2, reason=f"{token} outage",
                    error_class="channel_unavailable", category="provider_outage",
                    failed_at=old)
    receipt = dlq.record({"provider_id": "twilio"}, tier=None,
                         source_topic=stack.receipts_topic, reason=f"{token} uncorrelated",
                         error_class="uncorrelated_receipt", category="invalid_data")
    dlq.put(sms, email, p2, receipt)

    def ids(*args: str) -> set[str]:
        return {r["dlq_id"] for r in rows(cli("list", "--json", "--reason", token, *args))}

    assert ids() == {sms.dlq_id, email.dlq_id, p2.dlq_id, receipt.dlq_id}
    assert ids("--tier", "p1") == {sms.dlq_id, email.dlq_id}
    assert ids("--tier", "reconcile") == {receipt.dlq_id}
    assert ids("--channel", "EMAIL") == {email.dlq_id}
    assert ids("--channel", "sms") == {sms.dlq_id, p2.dlq_id}
    assert ids("--category", "provider_outage") == {p2.dlq_id}
    assert ids("--error-class", "render_error") == {sms.dlq_id}
    assert ids("--tenant", "globex") == {email.dlq_id}
    assert ids("--message-id", str(sms.message_id)) == {sms.dlq_id}
    since = (now() - timedelta(hours=1)).isoformat()
    assert ids("--since", since) == {sms.dlq_id, email.dlq_id, receipt.dlq_id}
    assert ids("--until", since) == {p2.dlq_id}
    assert len(rows(cli("list", "--json", "--reason", token, "--limit", "2"))) == 2

    table = cli("list", "--reason", token)
    assert table.exit_code == 0, table.output
    assert sms.dlq_id in table.output and "4 shown of 4 matching" in table.output
    assert PHONE not in table.output and EMAIL not in table.output
    assert cli("list", "--tier", "P9").exit_code == 2
    assert cli("list", "--since", "yesterday").exit_code == 2


def test_show_masks_recipients_and_reveal_is_audited(dlq: Dlq, cql: Session,
                                                     token: str) -> None:
    [rec] = dlq.put(dlq.record(ingest(), reason=f"{token} exhausted",
                               attempts=(attempt(5),)))
    masked = cli("show", rec.dlq_id)
    assert masked.exit_code == 0, masked.output
    assert PHONE not in masked.output and "+1415*****71" in masked.output
    assert "Your code" not in masked.output and "internal_error:RuntimeError" in masked.output
    doc = rows(cli("show", rec.dlq_id, "--json"))[0]
    assert doc["payload"]["recipient"] == "+1415*****71" and not doc["revealed"]
    assert "payload_encrypted" not in doc and not audit_rows(cql, "P1", rec.dlq_id)

    no_key = cli("show", rec.dlq_id, env={"NOTIFLOW_DLQ_KEY": None})
    assert no_key.exit_code == 2 and "NOTIFLOW_DLQ_KEY is not set" in no_key.output
    assert rec.dlq_id in no_key.output and PHONE not in no_key.output
    wrong = cli("show", rec.dlq_id, env={"NOTIFLOW_DLQ_KEY": Fernet.generate_key().decode()})
    assert wrong.exit_code == 2 and "cannot be decrypted with this key" in wrong.output
    assert cli("show", rec.dlq_id, "--reveal").exit_code == 2
    assert not audit_rows(cql, "P1", rec.dlq_id)

    clear = cli("show", rec.dlq_id, "--reveal", "--actor", "alice", "--why", "ticket 42")
    assert clear.exit_code == 0, clear.output
    assert PHONE in clear.output
    [row] = audit_rows(cql, "P1", rec.dlq_id)
    assert (row["action"], row["actor"], row["reason"]) == ("reveal", "alice", "ticket 42")
    assert row["message_id"] == rec.message_id
    assert cli("show", uuid.uuid4().hex).exit_code == 1


def test_replay_reenqueues_with_a_fresh_attempt_and_audit(dlq: Dlq, stack: Settings,
                                                          cql: Session, token: str) -> None:
    payload = ingest(Tier.P2, attempt=3, avoid_provider="twilio",
                     not_before=now().isoformat())
    [rec] = dlq.put(dlq.record(payload, tier=Tier.P2, reason=f"{token} exhausted",
                               attempts=(attempt(3),)))
    mid = payload["message_id"]
    cql.execute("INSERT INTO attempts (message_id, attempt_no, provider_id, outcome) "
                "VALUES (%s, 4, 'vonage', 'transient')", (mid,))
    topic = stack.ingest_topic("SMS", Tier.P2)
    args = ("replay", rec.dlq_id, "--actor", "bob", "--why", "provider fixed")
    early = cli(*args)
    assert early.exit_code == 1 and "not recorded yet" in early.output
    failed(cql, mid, Tier.P2, 4)

    dry = cli(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would replay" in dry.output and "attempt 5 (reopens FAILED)" in dry.output
    assert not replayed(stack, topic, rec.dlq_id) and not audit_rows(cql, "P2", rec.dlq_id)
    assert message_row(cql, mid)["status"] == "FAILED"

    done = cli(*args)
    assert done.exit_code == 0, done.output
    [msg] = replayed(stack, topic, rec.dlq_id)
    assert PHONE.encode() not in msg.value()
    out = envelope(stack).open(orjson.loads(msg.value()))
    assert out["message_id"] == mid and msg.key() == mid.encode()
    assert (out["attempt"], out["budget_base"]) == (5, 5)
    assert not {"not_before", "avoid_provider", "unknown_check"} & out.keys()
    assert out["recipient"] == PHONE and out["variables"] == {"code": "123456"}
    [row] = audit_rows(cql, "P2", rec.dlq_id)
    assert (row["action"], row["actor"], row["reason"]) == ("replay", "bob", "provider fixed")
    detail = orjson.loads(row["detail"])
    assert (detail["attempt"], detail["topic"], detail["previous_attempt"]) == (5, topic, 4)
    assert detail["reopened_from"] == "FAILED"
    msg_row = message_row(cql, mid)
    assert (msg_row["status"], msg_row["reason"]) == ("QUEUED", "dlq_replay")
    [reopened] = [e for e in cql.execute("SELECT * FROM message_events WHERE message_id = %s",
                                         (mid,)) if e["source"] == "dlq.replay"]
    assert (reopened["status"], reopened["attempt"], reopened["applied"]) == ("QUEUED", 5, True)
    assert not rows(cli("list", "--json", "--reason", token))
    [resolved] = rows(cli("list", "--json", "--reason", token, "--resolved"))
    assert resolved["resolution"]["state"] == "replayed"

    twice = cli(*args)
    assert twice.exit_code == 1 and "already replayed" in twice.output
    queued = cli(*args, "--again")
    assert queued.exit_code == 1 and "earlier replay of this message is queued" in queued.output
    assert len(replayed(stack, topic, rec.dlq_id)) == 1
    failed(cql, mid, Tier.P2, 5)
    again = cli(*args, "--again")
    assert again.exit_code == 0, again.output
    attempts = sorted(orjson.loads(m.value())["attempt"]
                      for m in replayed(stack, topic, rec.dlq_id))
    assert attempts == [5, 6] and len(audit_rows(cql, "P2", rec.dlq_id)) == 2


def test_replay_of_an_old_failed_message_delivers(
        dlq: Dlq, cql: Session, otp_template: dict[str, int], send_p1: ManagedProcess,
        fakes: str, token: str) -> None:
    accepted = now() - timedelta(hours=2)
    payload = ingest(Tier.P1, version=otp_template["acme"], attempt=5,
                     recipient="+12025550143", variables={"code": token[-6:]},
                     accepted_at=accepted.isoformat(),
                     expires_at=(accepted + timedelta(minutes=30)).isoformat())
    mid = payload["message_id"]
    failed(cql, mid, Tier.P1, 5)
    [rec] = dlq.put(dlq.record(payload, reason=f"{token} exhausted", attempts=(attempt(5),)))
    done = cli("replay", rec.dlq_id, "--actor", "carol", "--why", "bug fixed",
               "--extend-ttl", "600")
    assert done.exit_code == 0, done.output
    wait_for(lambda: received_at(fakes, SMS_PROVIDERS, {mid}).get(mid), timeout=30,
             what="the provider emulator to accept the replayed message")
    wait_for(lambda: (message_row(cql, mid) or {}).get("status") in SUCCESS, timeout=30,
             what="the message row to leave FAILED")
    [row] = audit_rows(cql, "P1", rec.dlq_id)
    assert orjson.loads(row["detail"])["extended_ttl"] is True


def test_replay_refuses_expired_unless_ttl_extended(dlq: Dlq, stack: Settings, cql: Session,
                                                    token: str) -> None:
    past = now() - timedelta(minutes=5)
    payload = ingest(Tier.P2, accepted_at=(past - timedelta(hours=1)).isoformat(),
                     expires_at=past.isoformat())
    [rec] = dlq.put(dlq.record(payload, tier=Tier.P2, reason=f"{token} exhausted"))
    topic = stack.ingest_topic("SMS", Tier.P2)
    args = ("replay", rec.dlq_id, "--actor", "dan", "--why", "retry")
    refused = cli(*args)
    assert refused.exit_code == 1 and "expired" in refused.output
    assert not replayed(stack, topic, rec.dlq_id) and not audit_rows(cql, "P2", rec.dlq_id)
    assert [r["dlq_id"] for r in rows(cli("list", "--json", "--reason", token))] == [rec.dlq_id]

    extended = cli(*args, "--extend-ttl", "600")
    assert extended.exit_code == 0, extended.output
    [msg] = replayed(stack, topic, rec.dlq_id)
    expires = datetime.fromisoformat(orjson.loads(msg.value())["expires_at"])
    assert timedelta(seconds=590) < expires - now() <= timedelta(seconds=600)


def test_replay_refuses_what_is_not_a_send_request(dlq: Dlq, stack: Settings,
                                                   token: str) -> None:
    receipt = dlq.record({"provider_id": "twilio", "status": "DELIVERED"}, tier=None,
                         source_topic=stack.receipts_topic, reason=f"{token} uncorrelated",
                         error_class="uncorrelated_receipt", category="invalid_data")
    poison = dlq.record(b'{"channel": "SMS", "tier": ', reason=f"{token} not JSON",
                        error_class="poison", category="invalid_data")
    dlq.put(receipt, poison)
    out = cli("replay", receipt.dlq_id, poison.dlq_id, uuid.uuid4().hex, "--actor", "eve",
              "--why", "try")
    assert out.exit_code == 1
    assert "not a send request" in out.output and "not a valid ingest record" in out.output
    assert "not found" in out.output
    left = {r["dlq_id"] for r in rows(cli("list", "--json", "--reason", token))}
    assert left == {receipt.dlq_id, poison.dlq_id}
    bulk = cli("replay", "--all", "--reason", token, "--actor", "eve", "--why", "try")
    assert bulk.exit_code == 1 and receipt.dlq_id not in bulk.output
    assert "not a valid ingest record" in bulk.output


def test_purge_hides_records_and_audits(dlq: Dlq, cql: Session, token: str) -> None:
    a, b, c = dlq.put(*(dlq.record(ingest(), reason=f"{token} poison {i}",
                                   error_class="poison", category="invalid_data")
                        for i in range(3)))
    one = cli("purge", a.dlq_id, "--actor", "frank", "--why", "junk")
    assert one.exit_code == 0, one.output
    left = {r["dlq_id"] for r in rows(cli("list", "--json", "--reason", token))}
    assert left == {b.dlq_id, c.dlq_id}
    [row] = audit_rows(cql, "P1", a.dlq_id)
    assert (row["action"], row["actor"], row["reason"]) == ("purge", "frank", "junk")
    again = cli("purge", a.dlq_id, "--actor", "frank", "--why", "junk")
    assert again.exit_code == 1 and "already purged" in again.output

    dry = cli("purge", "--all", "--reason", token, "--actor", "frank", "--why", "junk",
              "--dry-run")
    assert dry.exit_code == 0 and "2 would purge" in dry.output
    bulk = cli("purge", "--all", "--reason", token, "--actor", "frank", "--why", "junk")
    assert bulk.exit_code == 0 and "2 purged" in bulk.output
    assert not rows(cli("list", "--json", "--reason", token))
    assert all(len(audit_rows(cql, "P1", r.dlq_id)) == 1 for r in (b, c))
    assert cli("purge", "--actor", "frank", "--why", "junk").exit_code == 2
    assert cli("purge", "--before", now().isoformat(), "--reason", token, "--actor", "frank",
               "--why", "junk").exit_code == 2


@pytest.fixture
def namespace(isolated: Callable[..., Isolated]) -> tuple[Isolated, dict[str, str]]:
    """Topics of their own (for counts and deletions no other test may disturb), and the
    environment that points the CLI at them."""
    iso = isolated(f"dlq{uuid.uuid4().hex[:6]}")
    return iso, {"NOTIFLOW_TOPIC_PREFIX": iso.settings.topic_prefix}


def test_purge_before_deletes_old_records(namespace: tuple[Isolated, dict[str, str]],
                                          cql: Session) -> None:
    iso, env = namespace
    settings = iso.settings
    dlq = Dlq(settings)
    t0 = now()
    ms = [int((t0 - timedelta(hours=h)).timestamp() * 1000) for h in (3, 2, 0)]
    old1, old2, fresh = dlq.put(*(dlq.record(ingest(Tier.P3), tier=Tier.P3) for _ in ms),
                                timestamps=ms)
    cutoff = (t0 - timedelta(hours=1)).isoformat()
    args = ("purge", "--before", cutoff, "--tier", "P3", "--actor", "gina", "--why", "old")
    dry = cli(*args, "--dry-run", env=env)
    assert dry.exit_code == 0 and "would delete 2 record(s)" in dry.output, dry.output
    assert len(rows(cli("list", "--json", "--tier", "P3", env=env))) == 3

    done = cli(*args, env=env)
    assert done.exit_code == 0 and "deleted 2 record(s)" in done.output, done.output
    topic = settings.dlq_topic(Tier.P3)
    assert watermarks(settings, [topic]) == {(topic, 0): (2, 3)}
    assert [r["dlq_id"] for r in rows(cli("list", "--json", "--tier", "P3", env=env))] == [
        fresh.dlq_id]
    for r in (old1, old2):
        [row] = audit_rows(cql, "P3", r.dlq_id)
        assert row["action"] == "purge" and orjson.loads(row["detail"])["deleted_before"]
    [delete] = audit_rows(cql, "P3", f"{topic}[0]<2")
    assert delete["action"] == "delete_records" and delete["actor"] == "gina"


class GaugeRecorder:
    """Stands in for the OpenTelemetry gauge: the last value set per ``dlq``."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def set(self, amount: int | float, attributes: dict[str, str] | None = None) -> None:
        self.values[(attributes or {})["dlq"]] = amount


def test_depth_alert(namespace: tuple[Isolated, dict[str, str]],
                     caplog: pytest.LogCaptureFixture) -> None:
    iso, env = namespace
    settings = iso.settings
    dlq = Dlq(settings)
    first, _ = dlq.put(dlq.record(ingest(Tier.P0), tier=Tier.P0),
                       dlq.record(ingest(Tier.P0), tier=Tier.P0))
    topic = settings.dlq_topic(Tier.P0)
    alert = f"DLQ_DEPTH_ALERT dlq=P0 topic={topic} depth=2 threshold=1"
    calm = cli("depth", "--json", env=env)
    assert calm.exit_code == 0, calm.output
    assert orjson.loads(calm.stdout)["depth"][topic] == 2
    assert dlq_depth(settings)[topic] == 2
    assert not [r for r in caplog.records if "DLQ_DEPTH_ALERT" in r.getMessage()]

    api = iso.start("api", ["api"], NOTIFLOW_API_PORT=str(free_port()),
                    NOTIFLOW_DLQ__DEPTH_ALERT="1")
    loud = cli("depth", env={**env, "NOTIFLOW_DLQ__DEPTH_ALERT": "1"})
    assert loud.exit_code == 3, loud.output
    assert alert in loud.stdout
    [logged] = [r for r in caplog.records if "DLQ_DEPTH_ALERT" in r.getMessage()]
    assert (logged.name, logged.levelno, logged.getMessage()) == (
        "notiflow.dlq", logging.ERROR, alert)
    wait_for(lambda: alert in api.log_path.read_text(errors="replace"), timeout=60,
             what="the API process's depth monitor to raise the alert")

    gauge = GaugeRecorder()
    strict = settings.model_copy(update={"dlq": settings.dlq.model_copy(
        update={"depth_alert": 1})})

    ls = asyncio.run(LedgerSession.open(strict))
    caplog.clear()
    try:
        monitor = DepthMonitor(strict, ls.ledger, gauge=gauge)
        depths = [asyncio.run(monitor.check())[topic]]
        assert cli("purge", first.dlq_id, "--actor", "hal", "--why", "seen",
                   env=env).exit_code == 0
        depths.append(asyncio.run(monitor.check())[topic])
        dlq.put(*(dlq.record(ingest(Tier.P0), tier=Tier.P0) for _ in range(2)))
        depths.append(asyncio.run(monitor.check())[topic])
        admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
        for fut in admin.delete_records([TopicPartition(topic, 0, 3)]).values():
            fut.result(30)
        depths.append(asyncio.run(monitor.check())[topic])
    finally:
        ls.close()
    assert depths == [2, 1, 3, 1]
    assert gauge.values == {"P0": 1, "P1": 0, "P2": 0, "P3": 0, "reconcile": 0, "webhooks": 0}
    lines = [r.getMessage() for r in caplog.records if r.name == "notiflow.dlq"
             and r.getMessage().startswith("DLQ_DEPTH")]
    assert lines == [alert, f"DLQ_DEPTH_OK dlq=P0 topic={topic} depth=1 threshold=1",
                     alert.replace("depth=2", "depth=3"),
                     f"DLQ_DEPTH_OK dlq=P0 topic={topic} depth=1 threshold=1"]
    assert cli("depth", env={**env, "NOTIFLOW_DLQ__DEPTH_ALERT": "1"}).exit_code == 0


PROVIDER_BUG_HOOK = '''\
"""Test-only fault: every HTTP provider call raises while the file named by
NOTIFLOW_TEST_PROVIDER_BUG exists (an unexplained client bug; deleting the file fixes it)."""
import os


def _install() -> None:
    from notiflow.adapters.providers import common

    send = common.HttpProvider.send
    flag = os.environ["NOTIFLOW_TEST_PROVIDER_BUG"]

    async def buggy(self, message, **kwargs):
        if os.path.exists(flag):
            raise RuntimeError("injected provider client bug")
        return await send(self, message, **kwargs)

    common.HttpProvider.send = buggy


if os.environ.get("NOTIFLOW_TEST_PROVIDER_BUG"):
    _install()
'''


def test_send_flow_dead_letter_is_replayed_and_delivered(
        isolated: Callable[..., Isolated], cql: Session, otp_template: dict[str, int],
        fakes: str, tmp_path: Path, token: str) -> None:
    """A P0 send flow whose provider client raises dead-letters two OTPs after its retry
    budget (3 attempts: two, then one on the other vendor); replayed while the bug is still
    there, one gets a fresh budget of 3 more attempts and is dead-lettered again; after the
    fix its second replay is delivered. The other message expired meanwhile: its replay is
    refused."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(PROVIDER_BUG_HOOK)
    bug = tmp_path / "provider-bug"
    bug.touch()
    iso = isolated(f"dlqe2e{uuid.uuid4().hex[:6]}")
    env = {"NOTIFLOW_TOPIC_PREFIX": iso.settings.topic_prefix}
    reconcile = iso.start("reconcile", ["flow", "reconcile", "--recovery-dir",
                                        str(iso.recovery / "reconcile")])
    iso.flow(Tier.P0, NOTIFLOW_TEST_PROVIDER_BUG=str(bug), PYTHONPATH=os.pathsep.join(
        p for p in (str(hook), os.environ.get("PYTHONPATH")) if p))
    reconcile.wait_until(lambda: ready(reconcile), timeout=60)

    accepted = now()
    short_expiry = accepted + timedelta(seconds=4)
    docs = [ingest(Tier.P0, version=otp_template["acme"], recipient=phone,
                   variables={"code": token[-6:]}, accepted_at=accepted.isoformat(),
                   expires_at=expires.isoformat())
            for phone, expires in (("+12025550143", accepted + timedelta(minutes=5)),
                                   ("+12025550144", short_expiry))]
    topic = iso.settings.ingest_topic("SMS", Tier.P0)
    produce(iso.settings, [OutRecord(topic, d["message_id"].encode(), orjson.dumps(d),
                                     make_headers(d["message_id"], "acme", "P0"))
                           for d in docs])
    mid, short = docs[0]["message_id"], docs[1]["message_id"]
    dlq_topic = iso.settings.dlq_topic(Tier.P0)

    def dead_letter(message_id: str, *, after: Collection[str] = ()) -> DlqRecord | None:
        found = [DlqRecord.model_validate_json(m.value())
                 for m in read_topic(iso.settings, dlq_topic)]
        return next((r for r in found if r.message_id == message_id and r.dlq_id not in after),
                    None)

    def row_is(message_id: str, status: str, attempt: int | None = None) -> bool:
        row = message_row(cql, message_id) or {}
        return row.get("status") == status and attempt in (None, row.get("attempt"))

    first = wait_for(lambda: dead_letter(mid), timeout=60, what="the first dead letter")
    assert (first.category, first.error_class) == ("bug", "exhausted_unexplained")
    assert first.attempts[-1].attempt_no == 3
    assert "internal_error:RuntimeError" in first.reason
    wait_for(lambda: row_is(mid, "FAILED", 3), what="the message to end FAILED")
    dead_short = wait_for(lambda: dead_letter(short), what="the second dead letter")
    assert not emulator_records(fakes, mid)

    retry = cli("replay", first.dlq_id, "--actor", "ops-alice", "--why",
                "INC-7: retry after the vendor incident", env=env)
    assert retry.exit_code == 0, retry.output
    assert "attempt 4 (reopens FAILED)" in retry.output
    second = wait_for(lambda: dead_letter(mid, after={first.dlq_id}), timeout=60,
                      what="the replayed message to be dead-lettered again")
    assert second.attempts[-1].attempt_no == 6
    assert second.headers["dlq_replay_of"] == first.dlq_id
    wait_for(lambda: row_is(mid, "FAILED", 6), what="the replay to end FAILED")

    bug.unlink()
    fixed = cli("replay", second.dlq_id, "--actor", "ops-bob", "--why",
                "provider client bug fixed", env=env)
    assert fixed.exit_code == 0, fixed.output
    wait_for(lambda: (message_row(cql, mid) or {}).get("status") in SUCCESS, timeout=60,
             what="the second replay to reach the provider")
    assert [r["outcome"] for r in emulator_records(fakes, mid)] == ["accepted"]
    assert max(a["attempt_no"] for a in cql.execute(
        "SELECT attempt_no FROM attempts WHERE message_id = %s", (mid,))) == 7

    status = CliRunner().invoke(app, ["status", mid], env=env)
    assert status.exit_code == 0, status.output
    assert "retries_exhausted" in status.output and "dlq_replay" in status.output
    for dl, actor, why, attempt in ((first, "ops-alice", "INC-7", 4),
                                    (second, "ops-bob", "bug fixed", 7)):
        [row] = audit_rows(cql, "P0", dl.dlq_id)
        assert (row["action"], row["actor"], row["message_id"]) == ("replay", actor, mid)
        assert why in row["reason"] and accepted - timedelta(seconds=5) < row["at"].replace(
            tzinfo=UTC) <= now()
        detail = orjson.loads(row["detail"])
        assert (detail["attempt"], detail["budget_base"]) == (attempt, attempt)
        assert (detail["reopened_from"], detail["topic"]) == ("FAILED", topic)

    wait_for(lambda: now() > short_expiry, what="the second message's expiry")
    refused = cli("replay", dead_short.dlq_id, "--actor", "ops-bob", "--why", "same fix",
                  env=env)
    assert refused.exit_code == 1 and "expired" in refused.output, refused.output
    assert not audit_rows(cql, "P0", dead_short.dlq_id)
    assert [r["dlq_id"] for r in rows(cli("list", "--json", "--tier", "P0", env=env))] == [
        dead_short.dlq_id]
