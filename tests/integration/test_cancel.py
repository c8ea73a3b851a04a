"""``DELETE /v1/messages/{id}`` on the real stack: a queued message is cancelled before any
flow runs (the reconciler writes CANCELLED, the send flow later ends it CANCELLED without
sending it); another tenant's message is not found; a message a provider accepted is not
cancellable; Redis unreachable → 503; and 200 cancels racing the P1 send flow each end in
exactly one outcome: sent with the cancel refused, or cancelled and never sent."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.schemas.enums import Tier
from tests.helpers import (
    SUCCESS,
    accepted_counts,
    emulator_records,
    hold_async,
    message_row,
    report,
    wait_for,
)
from tests.integration.conftest import Isolated, RedisServer

pytestmark = pytest.mark.integration

RACES = 200
CONCURRENCY = 8
MAX_DELAY_S = 0.04
EMAIL_PROVIDERS = ("sendgrid", "smtp")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sms(version: int, tier: str = "P1") -> dict[str, Any]:
    return {"channel": "SMS", "tier": tier, "template_id": "otp",
            "template_version": version, "variables": {"code": uuid.uuid4().hex[:8]},
            "recipient": f"+1415556{random.randrange(10_000):04d}"}


def post(api: str, token: str, body: dict[str, Any]) -> str:
    r = httpx.post(f"{api}/v1/messages", json=body,
                   headers={**auth(token), "Idempotency-Key": uuid.uuid4().hex})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def status_of(api: str, token: str, mid: str) -> str:
    r = httpx.get(f"{api}/v1/messages/{mid}", headers=auth(token))
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


def history(cql: Session, mid: str) -> list[tuple[str, str]]:
    return [(r["status"], r["source"]) for r in cql.execute(
        "SELECT status, source FROM message_events WHERE message_id = %s", (mid,))]


def namespace(isolated: Callable[..., Isolated], name: str, **env: str) -> Isolated:
    """An isolated namespace with its own API and reconciler (no send flow yet)."""
    iso = isolated(name, **env)
    rec = iso.start("reconcile", ["flow", "reconcile", "--recovery-dir",
                                  str(iso.recovery / "reconcile")])
    rec.wait_until(lambda: "starting" in rec.log_path.read_text(errors="replace"))
    return iso


def start_api(iso: Isolated) -> str:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    iso.start("api", ["api"], NOTIFLOW_API_PORT=str(port)).wait_http(f"{base}/healthz")
    return base


def test_queued_message_cancelled_before_any_flow_runs(
        isolated: Callable[..., Isolated], tokens: dict[str, str],
        otp_template: dict[str, int], cql: Session, fakes: str) -> None:
    iso = namespace(isolated, "cancel-queued")
    api, token = start_api(iso), tokens["acme"]
    mid = post(api, token, sms(otp_template["acme"]))
    r = httpx.delete(f"{api}/v1/messages/{mid}", headers=auth(token))
    assert r.status_code == 200, r.text
    first = r.json()
    assert first["message_id"] == mid and first["status"] == "CANCELLED"
    again = httpx.delete(f"{api}/v1/messages/{mid}", headers=auth(token))
    assert again.status_code == 200 and again.json()["status"] == "CANCELLED"

    wait_for(lambda: status_of(api, token, mid) == "CANCELLED", what="CANCELLED written")
    settled = httpx.delete(f"{api}/v1/messages/{mid}", headers=auth(token))
    assert settled.status_code == 200 and settled.json() == first
    assert ("CANCELLED", "api") in history(cql, mid)

    iso.flow(Tier.P1)
    wait_for(lambda: ("CANCELLED", "send.p1") in history(cql, mid), timeout=60,
             what="the send flow ending the cancelled message")
    assert emulator_records(fakes, mid) == []
    assert status_of(api, token, mid) == "CANCELLED"


def test_another_tenants_or_unknown_message_is_not_found(
        api: str, tokens: dict[str, str], otp_template: dict[str, int]) -> None:
    mid = post(api, tokens["acme"], sms(otp_template["acme"]))
    for who, target in (("globex", mid), ("acme", f"msg_{uuid.uuid4().hex}"),
                        ("acme", "not%20an%20id")):
        r = httpx.delete(f"{api}/v1/messages/{target}", headers=auth(tokens[who]))
        assert r.status_code == 404, (who, target, r.text)
        assert r.json()["error"] == "not_found"
    assert httpx.delete(f"{api}/v1/messages/{mid}").status_code == 401


def test_a_provider_accepted_message_is_not_cancellable(
        api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p1: ManagedProcess, cql: Session) -> None:
    mid = post(api, tokens["acme"], sms(otp_template["acme"]))
    wait_for(lambda: (message_row(cql, mid) or {}).get("status") in SUCCESS,
             what="provider acceptance")
    r = httpx.delete(f"{api}/v1/messages/{mid}", headers=auth(tokens["acme"]))
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["reason"] == "not_cancellable" and body["current_status"] in SUCCESS
    assert body["current_status"] in body["message"]


def test_redis_unreachable_is_503_and_the_cancel_works_once_it_is_back(
        isolated: Callable[..., Isolated], tokens: dict[str, str],
        otp_template: dict[str, int], private_redis: RedisServer) -> None:
    iso = isolated("cancel-redis-down", NOTIFLOW_REDIS_URL=private_redis.url)
    api, token = start_api(iso), tokens["acme"]
    mid = post(api, token, sms(otp_template["acme"]))
    private_redis.stop(kill=True)
    try:
        r = httpx.delete(f"{api}/v1/messages/{mid}", headers=auth(token))
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"].isdigit()
        assert r.json()["reason"] == "cancel_unavailable"
    finally:
        private_redis.start()
    wait_for(lambda: httpx.delete(f"{api}/v1/messages/{mid}",
                                  headers=auth(token)).status_code == 200,
             timeout=30, what="the cancel accepted once Redis is back")


async def post_then_cancel(client: httpx.AsyncClient, token: str, version: int,
                           gate: asyncio.Semaphore) -> tuple[str, int, dict[str, Any]]:
    """POST a P1 message, then DELETE it after a random delay while the send flow picks it
    up."""
    async with gate:
        r = await client.post("/v1/messages", json=sms(version), headers={
            **auth(token), "Idempotency-Key": uuid.uuid4().hex})
        assert r.status_code == 202, r.text
        mid = str(r.json()["message_id"])
        await hold_async(random.uniform(0, MAX_DELAY_S))
        d = await client.delete(f"/v1/messages/{mid}", headers=auth(token))
        return mid, d.status_code, d.json()


def test_cancels_racing_the_send_flow_end_in_exactly_one_outcome(
        api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p1: ManagedProcess, cql: Session, fakes: str, capsys: Any) -> None:
    async def race() -> list[tuple[str, int, dict[str, Any]]]:
        gate = asyncio.Semaphore(CONCURRENCY)
        async with httpx.AsyncClient(base_url=api, timeout=30) as client:
            return await asyncio.gather(*(post_then_cancel(client, tokens["acme"],
                                                           otp_template["acme"], gate)
                                          for _ in range(RACES)))

    results = asyncio.run(race())
    final_statuses = SUCCESS | {"CANCELLED"}

    def finals() -> dict[str, Any] | None:
        rows = {mid: (message_row(cql, mid) or {}).get("status") for mid, _, _ in results}
        return rows if all(s in final_statuses for s in rows.values()) else None

    final = wait_for(finals, timeout=120, what="every raced message ended")
    accepted = accepted_counts(fakes)
    outcomes: Counter[str] = Counter()
    for mid, code, body in results:
        if code == 200:
            assert body["status"] == "CANCELLED"
            assert final[mid] == "CANCELLED", (mid, final[mid])
            assert emulator_records(fakes, mid) == [], f"cancelled {mid} reached a provider"
            outcomes["cancelled"] += 1
        else:
            assert code == 409, (mid, code, body)
            assert body["reason"] in ("already_sending", "not_cancellable"), body
            assert final[mid] in SUCCESS, (mid, final[mid])
            assert accepted.get(mid) == 1, (mid, accepted.get(mid))
            outcomes[f"sent ({body['reason']})"] += 1
    report(capsys, f"cancel races: {dict(outcomes)} of {RACES}")
    raced = outcomes["cancelled"] + outcomes["sent (already_sending)"]
    assert raced, f"no cancel reached the gate before the status moved on: {outcomes}"


SCHEDULED_RACES = 200
DUE_SPREAD_S = 0.8
"""A cancel goes out up to this long after the message's due instant: the scheduler's poll
and the send flow's pick-up fall inside it, so both outcomes occur."""


def test_cancels_at_the_due_instant_of_scheduled_messages_end_in_exactly_one_outcome(
        api: str, tokens: dict[str, str], send_p3: ManagedProcess, cql: Session,
        fakes: str, log_dir: Path, capsys: Any) -> None:
    """200 P3 emails scheduled a few seconds ahead (buckets, a scheduler, the P3 flow), each
    cancelled at (up to ``DUE_SPREAD_S`` after) its due instant: cancelled and never at a
    provider, or sent with the cancel refused."""
    token = tokens["mkt"]
    tpl = httpx.post(f"{api}/v1/templates", headers=auth(token), json={
        "template_id": f"race-{uuid.uuid4().hex[:6]}", "channel": "EMAIL",
        "subject": "Sale", "body": "Code {{ code }}"})
    assert tpl.status_code in (200, 201), tpl.text
    group = ProcessGroup()
    sched = group.add(ManagedProcess("scheduler-race", ["flow", "scheduler"], log_dir)).start()
    try:
        sched.wait_until(lambda: "claimed shard" in sched.log_path.read_text(errors="replace"))
        base = datetime.now(UTC) + timedelta(seconds=6)

        async def one(client: httpx.AsyncClient, i: int, gate: asyncio.Semaphore
                      ) -> tuple[str, int, dict[str, Any]]:
            async with gate:
                due = max(base + timedelta(milliseconds=50 * i),
                          datetime.now(UTC) + timedelta(seconds=1))
                r = await client.post("/v1/messages", headers={
                    **auth(token), "Idempotency-Key": uuid.uuid4().hex}, json={
                    "channel": "EMAIL", "tier": "P3", "category": "transactional",
                    "recipient": f"race.{uuid.uuid4().hex[:10]}@example.com",
                    "template_id": tpl.json()["template_id"],
                    "template_version": tpl.json()["version"], "variables": {"code": str(i)},
                    "scheduled_at": due.isoformat()})
            assert r.status_code == 202 and r.json()["status"] == "SCHEDULED", r.text
            mid = str(r.json()["message_id"])
            late = random.uniform(0, DUE_SPREAD_S)
            await hold_async((due - datetime.now(UTC)).total_seconds() + late)
            d = await client.delete(f"/v1/messages/{mid}", headers=auth(token))
            return mid, d.status_code, d.json()

        async def race() -> list[tuple[str, int, dict[str, Any]]]:
            gate = asyncio.Semaphore(CONCURRENCY)
            async with httpx.AsyncClient(base_url=api, timeout=30) as client:
                return await asyncio.gather(*(one(client, i, gate)
                                              for i in range(SCHEDULED_RACES)))

        results = asyncio.run(race())
    finally:
        group.stop_all()
    final_statuses = SUCCESS | {"CANCELLED"}

    def finals() -> dict[str, Any] | None:
        rows = {mid: (message_row(cql, mid) or {}).get("status") for mid, _, _ in results}
        return rows if all(s in final_statuses for s in rows.values()) else None

    final = wait_for(finals, timeout=120, what="every raced scheduled message ended")
    accepted = accepted_counts(fakes, providers=EMAIL_PROVIDERS)
    outcomes: Counter[str] = Counter()
    for mid, code, body in results:
        if code == 200:
            assert final[mid] == "CANCELLED", (mid, final[mid])
            assert accepted.get(mid) is None, f"cancelled {mid} reached a provider"
            outcomes["cancelled"] += 1
        else:
            assert code == 409 and body["reason"] in ("already_sending", "not_cancellable")
            assert final[mid] in SUCCESS and accepted.get(mid) == 1, (mid, final[mid])
            outcomes[f"sent ({body['reason']})"] += 1
    report(capsys, f"cancels at the due instant: {dict(outcomes)} of {SCHEDULED_RACES}")
