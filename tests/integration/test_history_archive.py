"""The history archive against the real stack: a (day, tenant) read from Cassandra, written as
Parquet to the stack's S3 server (SeaweedFS) with its manifest, skipped when archived before,
rewritten with ``force``; ``notiflow report``'s sections over it with chDB; and a message
sent through the API and the send flow found in the archive of its day."""

from __future__ import annotations

import asyncio
import hashlib
import io
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow.parquet as pq
import pytest
from cassandra.cluster import Session

from notiflow.adapters.object_store import ObjectStore
from notiflow.archive import DATASETS, manifest_key
from notiflow.correlation import CorrelationKeys
from notiflow.ops.archive_cli import manifests, run_archive
from notiflow.ops.procs import ManagedProcess
from notiflow.ops.report_cli import build
from notiflow.schemas.campaigns import row_message_id
from notiflow.settings import ArchiveSettings, Settings
from tests.helpers import hold_async, wait_for
from tests.integration.test_receipt_webhooks import status_is

pytestmark = pytest.mark.integration

PRESSURE_REPORT_S = 0.5
"""How often the test re-reports P0 pressure while it holds the archive back."""

DAY = date(2026, 11, 20)
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
CAMPAIGN = "cmp_" + uuid.uuid4().hex


@pytest.fixture
def archived(stack: Settings) -> Iterator[Settings]:
    """The stack's settings with an archive under a fresh prefix of its bucket (emptied
    afterwards)."""
    prefix = f"test-archive-{uuid.uuid4().hex[:10]}"
    yield stack.model_copy(update={"archive": ArchiveSettings(
        uri=f"s3://{stack.object_store.bucket}/{prefix}", slice=7)})
    store = ObjectStore.bucket(stack.object_store.bucket, stack.object_store)

    async def empty() -> None:
        for key in await store.list(prefix):
            await store.delete(key)

    asyncio.run(empty())


def seed(cql: Session, tenant: str, settings: Settings) -> None:
    """20 SMS messages (latencies 100..2000 ms, two refused once by twilio), one failed by a
    receipt; 3 campaign emails, one clicked."""
    def message(mid: str, channel: str, masked: str, status: str, provider: str) -> None:
        cql.execute(
            "INSERT INTO messages (message_id, tenant_id, channel, tier, category, "
            "recipient_hash, recipient_masked, status, attempt, provider_id, accepted_at, "
            "created_at, updated_at) VALUES (%s, %s, %s, 'P1', 'transactional', %s, %s, %s, 1, "
            "%s, %s, %s, %s)",
            (mid, tenant, channel, "h" * 32, masked, status, provider, T0, T0, T0))
        cql.execute("INSERT INTO messages_by_tenant_day (tenant_id, day, created_at, message_id,"
                    " channel, tier, category) VALUES (%s, %s, %s, %s, %s, 'P1', 'x')",
                    (tenant, DAY, T0, mid, channel))

    def event(mid: str, status: str, after_ms: int, source: str, eid: str,
              reason: str | None = None) -> None:
        cql.execute("INSERT INTO message_events (message_id, occurred_at, event_id, status, "
                    "attempt, reason, source, applied) VALUES (%s, %s, %s, %s, 1, %s, %s, true)",
                    (mid, T0 + timedelta(milliseconds=after_ms), eid, status, reason, source))

    def attempt(mid: str, no: int, provider: str, outcome: str, code: str | None) -> None:
        cql.execute("INSERT INTO attempts (message_id, attempt_no, provider_id, outcome, "
                    "error_code, started_at, completed_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (mid, no, provider, outcome, code, T0, T0))

    for i in range(1, 21):
        mid = f"msg_arch{tenant}{i}"
        failed = i == 20
        message(mid, "SMS", "+4179*****67", "FAILED" if failed else "DELIVERED", "twilio")
        event(mid, "PROVIDER_ACCEPTED", 50, "send", "send:1")
        if failed:
            event(mid, "FAILED", 3000, "receipt.twilio", "twilio:SMx:failed", "30003")
        else:
            event(mid, "DELIVERED", i * 100, "receipt.twilio", f"twilio:SM{i}:delivered")
        if i <= 2:
            attempt(mid, 1, "twilio", "transient", "http_503")
        attempt(mid, 2 if i <= 2 else 1, "twilio", "accepted", None)
    for row in (1, 2, 3):
        mid = row_message_id(CorrelationKeys.from_settings(settings), CAMPAIGN, row)
        message(mid, "EMAIL", "a***@example.com", "CLICKED" if row == 1 else "DELIVERED",
                "sendgrid")
        event(mid, "PROVIDER_ACCEPTED", 10, "send", "send:1")
        event(mid, "DELIVERED", 20, "receipt.sendgrid", f"sendgrid:d{row}")
        if row == 1:
            event(mid, "CLICKED", 30, "receipt.sendgrid", "sendgrid:c1")
        attempt(mid, 1, "sendgrid", "accepted", None)


async def read_part(settings: Settings, doc: dict[str, Any], dataset: str) -> Any:
    store, prefix = ObjectStore.open(settings.archive.uri, settings.object_store)
    f = doc["files"][dataset]
    data = await store.read(f"{prefix}/{f['key']}", 0, f["bytes"])
    assert hashlib.sha256(data).hexdigest() == f["sha256"]
    return pq.read_table(io.BytesIO(data))


def test_a_day_is_archived_once_and_reported(archived: Settings, cql: Session,
                                            tmp_path: Path) -> None:
    tenant = f"arch{uuid.uuid4().hex[:8]}"
    seed(cql, tenant, archived)
    [done] = asyncio.run(run_archive(archived, [DAY], [tenant]))
    assert not done.skipped
    assert done.rows == {"messages": 23, "events": 47, "attempts": 25, "receipts": 24}
    [doc] = [d for d in asyncio.run(manifests(archived)) if d["tenant_id"] == tenant]
    assert doc["day"] == "2026-11-20" and set(doc["files"]) == set(DATASETS)
    messages = asyncio.run(read_part(archived, doc, "messages")).to_pylist()
    assert {m["country"] for m in messages} == {"CH", None}
    assert not any("recipient_masked" in m for m in messages)

    [again] = asyncio.run(run_archive(archived, [DAY], [tenant]))
    assert again.skipped
    [forced] = asyncio.run(run_archive(archived, [DAY], [tenant], force=True))
    assert forced.rows == done.rows

    fetched, results = asyncio.run(build(archived, DAY, DAY, [tenant], tmp_path))
    assert fetched.parts == (("2026-11-20", tenant),)
    twilio = {r["provider"]: r for r in results["latency_by_provider"]}["twilio"]
    assert (twilio["messages"], twilio["p50_ms"]) == (19, 1000)
    errors = {r["provider"]: r for r in results["errors_by_provider"]}
    assert (errors["twilio"]["attempts"], errors["twilio"]["refused"],
            errors["twilio"]["delivery_failed"]) == (22, 2, 1)
    codes = {(r["stage"], r["code"]): r["n"] for r in results["error_codes"]}
    assert codes == {("send", "http_503"): 2, ("receipt", "FAILED 30003"): 1}
    [funnel] = results["campaign_funnel"]
    assert (funnel["campaign_id"], funnel["accepted"], funnel["delivered"],
            funnel["clicked"]) == (CAMPAIGN, 3, 3, 1)
    _, duck = asyncio.run(build(archived, DAY, DAY, [tenant], tmp_path / "d", "duckdb"))
    assert duck["campaign_funnel"] == results["campaign_funnel"]
    assert duck["errors_by_provider"] == results["errors_by_provider"]
    empty, nothing = asyncio.run(build(archived, DAY, DAY, ["nobody"], tmp_path / "x"))
    assert empty.parts == () and nothing == {}
    store, prefix = ObjectStore.open(archived.archive.uri, archived.object_store)
    assert asyncio.run(store.head(f"{prefix}/{manifest_key(DAY, tenant)}")).size > 0


def test_a_sent_message_is_in_its_days_archive(
        archived: Settings, api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p1: ManagedProcess, cql: Session) -> None:
    r = httpx.post(f"{api}/v1/messages", headers={"Authorization": f"Bearer {tokens['acme']}"},
                   json={"channel": "SMS", "tier": "P1", "recipient": "+14155552671",
                         "template_id": "otp", "template_version": otp_template["acme"],
                         "variables": {"code": "424242"}})
    assert r.status_code == 202, r.text
    mid = r.json()["message_id"]
    wait_for(lambda: status_is(cql, mid, "PROVIDER_ACCEPTED", "SENT", "DELIVERED"),
             timeout=90, what="the message sent")
    today = datetime.now(UTC).date()
    asyncio.run(run_archive(archived, [today], ["acme"]))
    [doc] = [d for d in asyncio.run(manifests(archived)) if d["tenant_id"] == "acme"]
    rows = {m["message_id"]: m for m in asyncio.run(
        read_part(archived, doc, "messages")).to_pylist()}
    mine = rows[mid]
    assert (mine["channel"], mine["tier"], mine["country"]) == ("SMS", "P1", "US")
    assert mine["provider_accepted_at"] is not None and mine["provider_id"]
    attempts = asyncio.run(read_part(archived, doc, "attempts")).to_pylist()
    assert [a["outcome"] for a in attempts if a["message_id"] == mid] == ["accepted"]


def test_the_archive_waits_while_p0_is_slow(archived: Settings, cql: Session) -> None:
    """P0's latency signal in Redis above its threshold: the archive's read window halves
    slice by slice until it is shut, and the archive waits; once the reports stop (stale
    after 2 s), it finishes."""
    import redis.asyncio as aioredis

    from notiflow.adapters import pressure

    tenant = f"arch{uuid.uuid4().hex[:8]}"
    seed(cql, tenant, archived)

    async def run() -> tuple[bool, Any]:
        client = aioredis.Redis.from_url(archived.redis_url)
        reporter = f"test-{uuid.uuid4().hex[:6]}"
        try:
            await pressure.report(client, archived.topic_prefix, reporter, 0.9)
            task = asyncio.create_task(run_archive(archived, [DAY], [tenant], force=True))
            for _ in range(8):
                await hold_async(PRESSURE_REPORT_S)
                await pressure.report(client, archived.topic_prefix, reporter, 0.9)
            held = not task.done()
            await client.hdel(pressure.pressure_key(archived.topic_prefix), reporter)
            return held, await asyncio.wait_for(task, 60)
        finally:
            await client.aclose()

    held, done = asyncio.run(run())
    assert held
    assert done[0].rows["messages"] == 23
