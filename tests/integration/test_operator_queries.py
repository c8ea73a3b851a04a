"""Every CQL query of ``ops/queries.md`` runs against data the real path wrote (API → send
flow → Twilio emulator → receipts → reconcile flow → Cassandra) and returns the expected rows;
none needs ALLOW FILTERING (Cassandra refuses such a query without it)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.adapters.cassandra.values import hour_of, utc
from notiflow.adapters.kafka_io import OutRecord, make_headers
from notiflow.ops.procs import ManagedProcess
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import StatusEvent
from notiflow.settings import Settings
from tests.helpers import message_row, produce, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OK_NUMBER = "+14155552671"
INVALID_NUMBER = "+15005550001"  # the Twilio emulator answers 21211: permanent, invalid


def send(api: str, token: str, version: int, recipient: str, tier: str = "P1") -> str:
    r = httpx.post(f"{api}/v1/messages", headers={
        "Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex},
        json={"channel": "SMS", "tier": tier, "recipient": recipient, "template_id": "otp",
              "template_version": version, "variables": {"code": uuid.uuid4().hex[:6]}})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def documented() -> list[str]:
    text = (ROOT / "ops" / "queries.md").read_text()
    return [q.strip() for q in re.findall(r"```sql\n(.*?)```", text, flags=re.S)]


def ts(d: datetime) -> str:
    return d.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "+0000"


def fill(query: str, keyspace: str, values: dict[str, str]) -> str:
    q = query.replace("notiflow.", f"{keyspace}.")
    for name, value in values.items():
        q = q.replace(f"<{name}>", value)
    assert not re.search(r"<\w+>", q), q
    return q


def table_of(query: str) -> str:
    m = re.search(r"FROM notiflow\.(\w+)", query)
    assert m is not None
    return m.group(1)


def test_documented_queries_answer_from_the_real_path(
        stack: Settings, api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p1: ManagedProcess, reconciler: ManagedProcess, cql: Session) -> None:
    started = datetime.now(UTC) - timedelta(seconds=1)
    version = otp_template["acme"]
    ok = [send(api, tokens["acme"], version, OK_NUMBER) for _ in range(2)]
    bad = send(api, tokens["acme"], version, INVALID_NUMBER)
    for mid in ok:
        wait_for(lambda mid=mid: (message_row(cql, mid) or {}).get("status") == "DELIVERED",
                 what=f"{mid} DELIVERED")
    wait_for(lambda: (message_row(cql, bad) or {}).get("status") == "FAILED", what="FAILED")
    first = message_row(cql, ok[0])
    failed = message_row(cql, bad)
    assert first is not None and failed is not None
    attempt = cql.execute("SELECT * FROM attempts WHERE message_id = %s", (ok[0],)).one()
    done = utc(attempt["completed_at"])
    failed_at = utc(failed["updated_at"])
    assert done is not None and failed_at is not None
    accepted = utc(first["accepted_at"])
    assert accepted is not None
    ks = stack.cassandra_keyspace

    def run(query: str, **values: str) -> list[dict[str, Any]]:
        return list(cql.execute(fill(query, ks, values)))

    # receipts are indexed right after their status is applied: wait for the DELIVERED one
    outcome_q = next(q for q in documented() if table_of(q) == "provider_outcomes_by_hour"
                     and "at >= '<from>'" in q)
    window = {"provider_id": "twilio", "hour": ts(hour_of(done)),
              "from": ts(done - timedelta(minutes=1)), "to": ts(done + timedelta(minutes=2))}
    wait_for(lambda: any(r["message_id"] == ok[0] and r["kind"] == "receipt"
                         and r["outcome"] == "DELIVERED" for r in run(outcome_q, **window)),
             what="the DELIVERED receipt in provider_outcomes_by_hour")

    values = {
        "messages": {"message_id": ok[0]},
        "message_events": {"message_id": ok[0]},
        "attempts": {"message_id": ok[0]},
        "provider_messages": {"provider_id": "twilio",
                              "provider_message_id": attempt["provider_message_id"]},
        "messages_by_tenant_day": {"tenant_id": "acme", "day": accepted.date().isoformat(),
                                   "since": ts(started)},
        "failures_by_tier_day": {"tier": "P1", "day": failed_at.date().isoformat(),
                                 "from": ts(failed_at - timedelta(minutes=1)),
                                 "to": ts(failed_at + timedelta(minutes=1))},
        "provider_outcomes_by_hour": window,
    }
    seen_tables = set()
    for query in documented():
        assert "ALLOW FILTERING" not in query.upper()
        table = table_of(query)
        seen_tables.add(table)
        rows = run(query, **values[table])
        if table == "messages":
            [row] = rows
            assert row["status"] == "DELIVERED" and row["tenant_id"] == "acme"
            assert row["recipient_masked"] != OK_NUMBER and OK_NUMBER not in str(row)
        elif table == "message_events":
            assert {"QUEUED", "PROVIDER_ACCEPTED", "DELIVERED"} <= {r["status"] for r in rows}
        elif table == "attempts":
            [row] = rows
            assert row["outcome"] == "accepted" and row["provider_id"] == "twilio"
        elif table == "provider_messages":
            assert [(r["message_id"], r["attempt_no"]) for r in rows] == [(ok[0], 1)]
        elif table == "messages_by_tenant_day":
            if accepted.date() == failed_at.date():
                assert {*ok, bad} <= {r["message_id"] for r in rows}
            assert ok[0] in {r["message_id"] for r in rows}
        elif table == "failures_by_tier_day" and "count" in query:
            assert rows[0]["count"] >= 1
        elif table == "failures_by_tier_day":
            mine = [r for r in rows if r["message_id"] == bad]
            assert len(mine) == 1, mine
            expected = {"status": "FAILED", "reason": "invalid_recipient", "tenant_id": "acme",
                        "channel": "SMS", "provider_id": "twilio", "attempt": 1}
            assert {k: mine[0][k] for k in expected.keys() & mine[0].keys()} == {
                k: v for k, v in expected.items() if k in mine[0]}
            assert {"status", "reason", "tenant_id", "provider_id"} <= mine[0].keys()
            assert not {*ok} & {r["message_id"] for r in rows}
        elif table == "provider_outcomes_by_hour" and "message_id" not in rows[0]:
            summary = {(r["kind"], r["outcome"]) for r in rows}  # the per-kind summary
            assert {("attempt", "accepted"), ("receipt", "DELIVERED")} <= summary
        elif table == "provider_outcomes_by_hour":
            got = {(r["message_id"], r["kind"], r["outcome"]) for r in rows}
            assert (ok[0], "attempt", "accepted") in got
            assert (ok[0], "receipt", "DELIVERED") in got
            if hour_of(done) == hour_of(failed_at):
                assert (bad, "attempt", "permanent") in got
            mine = [r for r in rows if r["message_id"] == ok[0] and r["kind"] == "attempt"]
            assert mine and all(r["latency_ms"] is not None and r["latency_ms"] >= 0
                                for r in mine)
    assert seen_tables == set(values)


def test_replayed_failure_event_adds_no_second_failure_row(
        stack: Settings, api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p1: ManagedProcess, reconciler: ManagedProcess, cql: Session) -> None:
    bad = send(api, tokens["acme"], otp_template["acme"], INVALID_NUMBER)
    wait_for(lambda: (message_row(cql, bad) or {}).get("status") == "FAILED", what="FAILED")
    row = message_row(cql, bad)
    assert row is not None
    day = utc(row["updated_at"]).date()  # type: ignore[union-attr]
    shards = ", ".join(str(i) for i in range(32))

    def failure_rows() -> list[dict[str, Any]]:
        return [r for r in cql.execute(
            f"SELECT * FROM failures_by_tier_day WHERE tier = 'P1' AND day = %s "
            f"AND shard IN ({shards})", (day,)) if r["message_id"] == bad]

    assert len(wait_for(failure_rows, what="the failure row")) == 1
    replay = StatusEvent(
        event_id=f"replay-{uuid.uuid4().hex}", message_id=bad, tenant_id="acme",
        channel="SMS", tier="P1", status=Status.FAILED, attempt=1, reason="invalid_recipient",
        occurred_at=datetime.now(UTC), source="test.replay")
    produce(stack, [OutRecord(stack.events_topic, bad.encode(),
                              replay.model_dump_json().encode(),
                              make_headers(bad, "acme", "P1"))])
    wait_for(lambda: any(e["source"] == "test.replay" for e in cql.execute(
        "SELECT source FROM message_events WHERE message_id = %s", (bad,))),
        what="the replayed event recorded")
    assert len(failure_rows()) == 1
