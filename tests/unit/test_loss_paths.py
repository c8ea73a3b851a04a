"""Nothing accepted is dropped silently: an inbox mark is acknowledged only once its receipts
are in Kafka and its state is stored (a failure of either is answered, and the client's retry
repeats both), and a client status webhook too old to announce becomes a dead letter of its
tenant (while history read on a first start is still skipped)."""

from __future__ import annotations

import concurrent.futures
import re
from datetime import UTC, datetime, timedelta
from functools import partial
from ipaddress import IPv4Network
from typing import Any

import orjson
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import Application
from bytewax.connectors.kafka import KafkaSourceMessage
from bytewax.testing import TestingSink, TestingSource, run_main
from cassandra import OperationTimedOut
from cryptography.fernet import Fernet

from notiflow.adapters.client_webhooks import AttemptResult, Verdict
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.inbox_store import InboxItem, InboxStore
from notiflow.adapters.kafka_io import OutRecord
from notiflow.flows.common.guard import charged_to_tenant, source_of
from notiflow.flows.webhooks.status_webhooks import build_webhook_flow, parse_change
from notiflow.flows.webhooks.webhook_age import (
    HISTORY_HEADER,
    Fresh,
    HistorySource,
    HistoryState,
    is_history,
)
from notiflow.flows.webhooks.webhook_items import StatusChange
from notiflow.flows.webhooks.webhook_sender import Request, Result
from notiflow.inbox.server import InboxServer
from notiflow.inbox.states import InboxState
from notiflow.inbox.tokens import mint, verify
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import DlqRecord, Receipt
from notiflow.settings import EgressSettings, Settings, TenantConfig
from tests.fakes import Producer

KEY = "k" * 43
T0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)


# inbox receipts ----------------------------------------------------------------------------


class _Prepared:
    def __init__(self, cql: str) -> None:
        self.cql = cql


class _Done:
    def __init__(self, rows: list[dict[str, Any]] | None, exc: BaseException | None) -> None:
        self.rows, self.exc = rows, exc

    def add_callbacks(self, ok: Any, err: Any) -> None:
        if self.exc is not None:
            err(self.exc)
        else:
            ok(self.rows)


class FakeSession:
    """The inbox tables in memory, answering the statements ``InboxStore`` prepares; an
    ``UPDATE`` raises while ``updates_fail``."""

    def __init__(self) -> None:
        self.items: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.index: dict[tuple[str, str, str], datetime] = {}
        self.updates_fail = False

    def prepare(self, cql: str) -> _Prepared:
        return _Prepared(cql)

    def execute_async(self, stmt: _Prepared, params: tuple[Any, ...]) -> _Done:
        try:
            return _Done(self._run(stmt.cql, params), None)
        except OperationTimedOut as exc:
            return _Done(None, exc)

    def _run(self, cql: str, p: tuple[Any, ...]) -> list[dict[str, Any]]:
        if cql.startswith("INSERT INTO inbox_items"):
            names = ("tenant_id", "user_id", "created_at", "message_id", "tier", "category",
                     "attempt", "content")
            row = self.items.setdefault(p[:4], {"seen_at": None, "read_at": None,
                                                "archived_at": None})
            row.update(zip(names, p[:8], strict=True))
        elif cql.startswith("INSERT INTO inbox_index"):
            self.index[p[:3]] = p[3]
        elif cql.startswith("SELECT created_at FROM inbox_index"):
            at = self.index.get(p[:3])
            return [] if at is None else [{"created_at": at}]
        elif cql.startswith("SELECT"):
            found = self.items.get(p[:4])
            return [] if found is None else [dict(found)]
        elif cql.startswith("UPDATE inbox_items"):
            if self.updates_fail:
                raise OperationTimedOut("the write timed out")
            match = re.search(r"SET (.*) WHERE", cql)
            assert match is not None
            cols = [c.split(" = ")[0] for c in match[1].split(", ")]
            self.items[p[-4:]].update(zip(cols, p[1:1 + len(cols)], strict=True))
        else:
            raise AssertionError(cql)
        return []


class ReceiptProducer(Producer):
    """The shared fake producer, reading back the receipts it was given."""

    def receipts(self) -> list[Receipt]:
        return [Receipt.model_validate_json(r.value) for r in self.records]


class FakeFeed:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    async def publish(self, tenant_id: str, user_id: str, event: dict[str, Any]) -> int:
        self.events.append(event)
        return 1


def inbox_settings() -> Settings:
    return Settings(tenants=(TenantConfig(id="acme", inbox_keys=(KEY,)),))


async def inbox(session: FakeSession) -> tuple[InboxServer, InboxStore, ReceiptProducer,
                                                 FakeFeed]:
    settings = inbox_settings()
    anys: Any = session
    store = InboxStore(anys, settings, DlqCipher(Fernet.generate_key()))
    await store.put(InboxItem("acme", "u-1", "msg_1", T0, "P1", "security", 1, "Hi", "New"),
                    T0)
    producer, feed = ReceiptProducer(), FakeFeed()
    anyp: Any = producer
    anyf: Any = feed
    return InboxServer(settings, store, anyf, anyp), store, producer, feed


async def post_state(server: InboxServer, state: str) -> tuple[int, dict[str, Any], str]:
    app = Application()
    app.add_routes(server.routes())
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        r = await client.post("/v1/inbox/msg_1/state", data=orjson.dumps({"state": state}),
                              headers={"Authorization": f"Bearer {mint(KEY, 'acme', 'u-1')}"})
        return r.status, orjson.loads(await r.read()), r.headers.get("Retry-After", "")


async def test_a_seen_mark_while_kafka_is_down_is_refused_and_its_retry_reports_delivered(
) -> None:
    session = FakeSession()
    server, store, producer, feed = await inbox(session)
    producer.up = False
    status, body, retry_after = await post_state(server, "seen")
    assert (status, body["reason"], retry_after) == (503, "receipts_unavailable", "1")
    item = await store.get("acme", "u-1", "msg_1")
    assert item is not None and item.state is InboxState.NEW
    assert feed.events == []

    producer.up = True
    status, body, _ = await post_state(server, "seen")
    assert (status, body["state"]) == (200, "seen")
    [receipt] = producer.receipts()
    assert (receipt.status, receipt.message_id, receipt.provider_event_id) == (
        Status.DELIVERED, "msg_1", "msg_1:seen")
    assert feed.events == [{"type": "state", "id": "msg_1", "state": "seen"}]


async def test_a_store_failure_after_the_receipts_repeats_them_with_the_same_event_id() -> None:
    session = FakeSession()
    server, store, producer, _ = await inbox(session)
    session.updates_fail = True
    status, body, _ = await post_state(server, "read")
    assert (status, body["reason"]) == (503, "store_unavailable")
    item = await store.get("acme", "u-1", "msg_1")
    assert item is not None and item.state is InboxState.NEW

    session.updates_fail = False
    status, body, _ = await post_state(server, "read")
    assert (status, body["state"]) == (200, "read")
    events = [(r.status, r.provider_event_id) for r in producer.receipts()]
    assert events == [(Status.DELIVERED, "msg_1:seen"), (Status.OPENED, "msg_1:read")] * 2
    item = await store.get("acme", "u-1", "msg_1")
    assert item is not None and item.state is InboxState.READ


async def test_a_mark_that_moves_nothing_reports_nothing_and_needs_no_kafka() -> None:
    server, _, producer, _ = await inbox(FakeSession())
    assert (await post_state(server, "read"))[0] == 200
    producer.up = False
    status, body, _ = await post_state(server, "seen")
    assert (status, body["state"]) == (200, "read")
    assert [r.status for r in producer.receipts()] == [Status.DELIVERED, Status.OPENED]


class Frames:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def offer(self, frame: bytes) -> None:
        self.frames.append(orjson.loads(frame))


async def test_a_websocket_mark_that_was_not_recorded_is_answered_with_an_error_frame() -> None:
    server, store, producer, _ = await inbox(FakeSession())
    user = verify(mint(KEY, "acme", "u-1"), server.settings)
    conn = Frames()
    anyc: Any = conn
    producer.up = False
    await server.on_client_frame(user, anyc, '{"type": "mark", "id": "msg_1", "state": "seen"}')
    assert conn.frames == [{"type": "error", "reason": "receipts_unavailable", "id": "msg_1"}]
    producer.up = True
    await server.on_client_frame(user, anyc, '{"type": "mark", "id": "msg_1", "state": "seen"}')
    assert conn.frames[-1] == {"type": "state", "id": "msg_1", "state": "seen"}
    assert [r.status for r in producer.receipts()] == [Status.DELIVERED]
    item = await store.get("acme", "u-1", "msg_1")
    assert item is not None and item.seen_at is not None



# client webhooks too old to announce -------------------------------------------------------

WH_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
HOOK = "http://127.0.0.1:9/hook"


class Delivering:
    """A webhook sender whose every POST is answered 200 at once (nothing leaves the
    process); it records the message ids it was asked to POST."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def submit(self, request: Request) -> concurrent.futures.Future[Result]:
        self.sent.append(str(orjson.loads(request.body)["data"]["message_id"]))
        fut: concurrent.futures.Future[Result] = concurrent.futures.Future()
        now = datetime.now(UTC)
        fut.set_result(AttemptResult(Verdict.DELIVERED, "http_200", now, now, status_code=200))
        return fut

    def saturated(self) -> bool:
        return False


def webhook_settings() -> Settings:
    return Settings(
        tenants=[TenantConfig(id="acme", token="t" * 32, webhook_secrets=[WH_SECRET])],
        dlq_key=Fernet.generate_key().decode(),
        egress=EgressSettings(allow_http=True, allow_networks=(IPv4Network("127.0.0.0/8"),)))


def status_record(settings: Settings, mid: str, age: timedelta, offset: int, *,
                  headers: list[tuple[str, bytes]] | None = None,
                  appended_ms: int = 1) -> KafkaSourceMessage[bytes | None, bytes | None]:
    at = datetime.now(UTC) - age
    value = orjson.dumps({
        "event_id": f"{mid}:DELIVERED", "message_id": mid, "tenant_id": "acme",
        "channel": "SMS", "tier": "P1", "status": "DELIVERED", "attempt": 1,
        "occurred_at": at.isoformat(), "source": "test",
        "message": {"tenant_id": "acme", "channel": "SMS", "tier": "P1",
                    "category": "transactional", "template_id": "otp", "template_version": 1,
                    "recipient_hash": "h", "recipient_masked": "+1415*****71",
                    "accepted_at": at.isoformat(), "status_webhook": HOOK}})
    return KafkaSourceMessage(key=None, value=value, topic=settings.events_topic,
                              headers=headers or [], offset=offset, partition=0,
                              timestamp=(1, appended_ms))


def run_webhooks(settings: Settings, records: list[Any]) -> tuple[list[str], list[DlqRecord]]:
    sender, out = Delivering(), list[OutRecord]()
    anys: Any = sender
    run_main(build_webhook_flow(settings, source=TestingSource(records),
                                sink=TestingSink(out), sender=anys, receipts=False,
                                eof_timeout=5.0))
    assert {r.topic for r in out} <= {settings.webhooks_dlq_topic}
    return sender.sent, [DlqRecord.model_validate_json(r.value) for r in out]


def test_a_status_change_too_old_to_announce_becomes_a_dead_letter_of_its_tenant() -> None:
    s = webhook_settings()
    sent, dead = run_webhooks(s, [
        status_record(s, "msg_new", timedelta(seconds=1), 0),
        status_record(s, "msg_late", timedelta(days=2), 1),
        status_record(s, "msg_history", timedelta(days=2), 2,
                      headers=[(HISTORY_HEADER, b"1")])])
    assert sent == ["msg_new"]
    [letter] = dead
    assert (letter.message_id, letter.tenant_id, letter.error_class, letter.category) == (
        "msg_late", "acme", "webhook_stale", "unavailable")
    assert "not announced late" in letter.reason and "msg_late" not in letter.reason
    assert (letter.source_topic, letter.source_offset) == (s.events_topic, 1)
    payload = orjson.loads(DlqCipher.from_settings(s).decrypt(letter.payload_encrypted))
    assert payload["url"] == HOOK and payload["webhook_id"] == letter.headers["webhook_id"]
    assert orjson.loads(payload["body"])["data"]["status"] == "DELIVERED"
    assert charged_to_tenant(letter) and source_of(letter) == "tenant:acme"


class Partition:
    """A source partition of fixed records; its snapshot is an offset."""

    def __init__(self, items: list[Any], offset: int | None) -> None:
        self.items = items
        self.offset = offset or 0

    def next_batch(self) -> list[Any]:
        items, self.items = self.items, []
        return items

    def next_awake(self) -> datetime | None:
        return None

    def snapshot(self) -> int:
        return self.offset

    def close(self) -> None:
        pass


class Records:
    def __init__(self, items: list[Any]) -> None:
        self.items = items
        self.resumed: list[Any] = []

    def list_parts(self) -> list[str]:
        return ["0-notify.events"]

    def build_part(self, step_id: str, for_part: str, resume_state: Any) -> Partition:
        self.resumed.append(resume_state)
        return Partition(self.items, resume_state)


def test_records_appended_before_a_first_start_are_history_and_a_forged_mark_is_removed(
) -> None:
    s = webhook_settings()
    first_read_ms = 1_000_000
    records = Records([
        status_record(s, "msg_before", timedelta(days=2), 0, appended_ms=first_read_ms - 1),
        status_record(s, "msg_after", timedelta(days=2), 1, appended_ms=first_read_ms,
                      headers=[(HISTORY_HEADER, b"1")])])
    anyr: Any = records
    source = HistorySource(anyr, clock=lambda: first_read_ms / 1000)
    part = source.build_part("flow.events", "0-notify.events", None)
    before, after = part.next_batch()
    assert isinstance(before, KafkaSourceMessage) and isinstance(after, KafkaSourceMessage)
    assert is_history(before.headers) and not is_history(after.headers)
    state = part.snapshot()
    assert state == HistoryState(0, first_read_ms)
    later = HistorySource(anyr, clock=lambda: 9e12).build_part("flow.events",
                                                               "0-notify.events", state)
    assert later.since_ms == first_read_ms and records.resumed == [None, 0]
    legacy = HistorySource(anyr, clock=lambda: 9e12).build_part("flow.events",
                                                                "0-notify.events", 7)
    assert legacy.since_ms == 0 and records.resumed[-1] == 7


def test_only_history_older_than_the_schedule_is_skipped() -> None:
    s = webhook_settings()
    now = datetime.now(UTC)
    fresh = Fresh(timedelta(hours=28), lambda: now)
    old, young = timedelta(days=2), timedelta(hours=1)
    history = [(HISTORY_HEADER, b"1")]
    change = partial(parse_change, receipts_topic=s.receipts_topic)
    assert not fresh(must(change(status_record(s, "m", old, 0, headers=history))))
    assert fresh(must(change(status_record(s, "m", old, 0))))
    assert fresh(must(change(status_record(s, "m", young, 0, headers=history))))


def must(change: StatusChange | None) -> StatusChange:
    assert change is not None
    return change
