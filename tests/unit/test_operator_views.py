"""Pure parts of the operator views: ``notiflow top`` (event window, breaker hashes, the
plain frame), the message-list cursor and walk (``recent_messages`` over a fake session),
``--since`` parsing, and the lint of ``ops/queries.md``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from notiflow.adapters.cassandra import listing, messages
from notiflow.adapters.cassandra.listing import Cursor
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.cassandra.values import operator_shard
from notiflow.adapters.rows import MessageHeadRow
from notiflow.gateway.message_list import check_since
from notiflow.ops.messages_cli import messages_table, parse_since
from notiflow.ops.top import (
    Breaker,
    EventWindow,
    Frame,
    Seen,
    TierRow,
    breaker_from_hash,
    frame_text,
    nearest_rank,
    parse_event,
)
from notiflow.schemas.enums import Status, Tier
from notiflow.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
STATEMENTS = {**messages.STATEMENTS, **listing.STATEMENTS}
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


# ------------------------------------------------------------------------------ top


def event(status: str, at: datetime, *, tier: str = "P0", accepted: datetime | None = None,
          event_id: str | None = None) -> bytes:
    doc: dict[str, Any] = {"event_id": event_id or f"e-{status}-{at.timestamp()}",
                           "message_id": "msg_1", "tenant_id": "acme", "channel": "SMS",
                           "tier": tier, "status": status, "attempt": 1,
                           "occurred_at": at.isoformat(), "source": "send"}
    if accepted is not None:
        doc["message"] = {"accepted_at": accepted.isoformat()}
    return orjson.dumps(doc)


def test_parse_event_takes_latency_from_the_snapshot_of_provider_accepted_only() -> None:
    pa = parse_event(event("PROVIDER_ACCEPTED", T0, accepted=T0 - timedelta(seconds=0.25)))
    assert pa is not None and pa.tier is Tier.P0 and pa.latency == pytest.approx(0.25)
    failed = parse_event(event("FAILED", T0, accepted=T0 - timedelta(seconds=3)))
    assert failed is not None and failed.latency is None
    assert parse_event(b"not json") is None
    assert parse_event(b'{"status": "NOPE"}') is None
    assert parse_event(None) is None


def test_nearest_rank() -> None:
    assert nearest_rank([], 0.99) is None
    assert nearest_rank([3.0], 0.99) == 3.0
    values = [float(i) for i in range(1, 101)]
    assert nearest_rank(values, 0.99) == 99.0
    assert nearest_rank(values, 0.5) == 50.0


def test_event_window_rates_p99_and_dedup() -> None:
    w = EventWindow(window_s=10, latency_window_s=60)
    now = T0.timestamp()

    def add(status: str, ago: float, tier: Tier = Tier.P0, latency: float | None = None,
            eid: str | None = None) -> None:
        w.add(Seen(eid or f"{status}{ago}{tier}", tier, Status(status), now - ago, latency))

    for i in range(20):  # 20 done within the last 10 s: 2/s
        add("PROVIDER_ACCEPTED", i * 0.4, latency=0.1 + i / 100)
    add("PROVIDER_ACCEPTED", 0.1, latency=0.5, eid="dup")
    add("PROVIDER_ACCEPTED", 0.1, latency=0.5, eid="dup")  # a duplicate: ignored
    add("FAILED", 1)  # terminal: counts as done
    add("RETRY_PENDING", 2)
    add("RETRY_PENDING", 3)
    add("PROCESSING", 1)  # neither
    add("PROVIDER_ACCEPTED", 30, latency=9.0)  # outside the rate window, inside p99's
    add("SUPPRESSED", 5, tier=Tier.P3)
    add("PROVIDER_ACCEPTED", 300, latency=100.0)  # outside both (pruned)
    w.prune(now)
    s = w.stats(now)
    assert w.duplicates == 1
    assert s[Tier.P0].done_per_s == pytest.approx(2.2)
    assert s[Tier.P0].retries_per_s == pytest.approx(0.2)
    assert s[Tier.P0].latency_samples == 22
    assert s[Tier.P0].p99_s == 9.0
    assert s[Tier.P3].done_per_s == pytest.approx(0.1) and s[Tier.P3].p99_s is None
    assert s[Tier.P1].done_per_s == 0 and s[Tier.P1].p99_s is None


def test_breaker_hash_states() -> None:
    now = T0.timestamp()
    us = int(now * 1_000_000)
    rec = 60_000_000
    assert breaker_from_hash("twilio", {}, now, rec).state == "CLOSED"
    opened = {"st": "1", "since": str(us - 5_000_000), "until": str(us + 55_000_000),
              "why": "failures:5", "w": "1", "wt": "0"}
    b = breaker_from_hash("twilio", opened, now, rec)
    assert (b.state, b.why) == ("OPEN", "failures:5")
    late = {**opened, "until": str(us - 1)}
    assert breaker_from_hash("twilio", late, now, rec).state == "HALF_OPEN"
    assert breaker_from_hash("vonage", {"st": "2"}, now, rec).state == "HALF_OPEN"
    throttled = {"st": "0", "w": "0.5", "wt": str(us - 30_000_000)}
    assert breaker_from_hash("fcm", throttled, now, rec).weight == pytest.approx(1.0)
    fresh = {"st": "0", "w": "0.5", "wt": str(us)}
    assert breaker_from_hash("fcm", fresh, now, rec).weight == pytest.approx(0.5)


def test_frame_text_is_plain_and_complete() -> None:
    rows = tuple(TierRow(t, 12.5 if t is Tier.P0 else 0.0, 0.3 if t is Tier.P1 else 0.0,
                         1.5 if t is Tier.P0 else None, 40 if t is Tier.P0 else 0,
                         timedelta(seconds=1), 0.0 if t is not Tier.P3 else None,
                         1 if t is not Tier.P3 else 0, 0)
                 for t in Tier)
    frame = Frame(T0, rows, (Breaker("twilio", "CLOSED", None, "", 1.0),
                             Breaker("vonage", "OPEN", T0, "failures:5", 1.0)),
                  {"P0": 0, "P1": 0, "P2": 0, "P3": 0, "reconcile": 2, "webhooks": 0}, 41)
    text = frame_text(frame)
    assert "\x1b[" not in text
    p0 = next(line for line in text.splitlines() if line.strip("│┃ ").startswith("P0"))
    assert "12.5" in p0 and "1.5 s" in p0
    assert "no flow reporting" in next(line for line in text.splitlines()
                                       if line.strip("│┃ ").startswith("P3"))
    assert "twilio" in text and "CLOSED" in text and "OPEN" in text and "failures:5" in text
    assert "reconcile=2" in text


# ------------------------------------------------------------------ message list (API/CLI)


def test_cursor_round_trip_and_garbage() -> None:
    c = Cursor(datetime(2026, 11, 30, 1, 2, 3, 456000, tzinfo=UTC), "msg_abc")
    assert Cursor.decode(c.encode()) == c
    for bad in ("", "!!!", "bm9wZQ", Cursor(T0, "x" * 65).encode()):
        with pytest.raises(ValueError):
            Cursor.decode(bad)


def test_check_since_bounds() -> None:
    from notiflow.gateway.errors import ApiError

    retention = timedelta(days=30)
    assert check_since(None, T0, retention) == T0 - timedelta(hours=24)
    assert check_since(T0 - timedelta(hours=2), T0, retention) == T0 - timedelta(hours=2)
    for bad in (T0 + timedelta(seconds=1), T0 - timedelta(days=31)):
        with pytest.raises(ApiError) as err:
            check_since(bad, T0, retention)
        assert err.value.status == 422 and err.value.reason == "invalid_since"


def test_parse_since() -> None:
    assert parse_since("90s", T0) == T0 - timedelta(seconds=90)
    assert parse_since("1h", T0) == T0 - timedelta(hours=1)
    assert parse_since("2d", T0) == T0 - timedelta(days=2)
    assert parse_since("2026-11-30T10:00:00", T0) == datetime(2026, 11, 30, 10, tzinfo=UTC)
    assert parse_since("2026-11-30T10:00:00+01:00", T0) == datetime(2026, 11, 30, 9, tzinfo=UTC)
    with pytest.raises(ValueError):
        parse_since("yesterday", T0)


def test_messages_table_shows_only_the_mask() -> None:
    from rich.console import Console

    row = {"message_id": "msg_1", "tenant_id": "acme", "channel": "SMS", "tier": "P1",
           "status": "FAILED", "reason": "invalid_recipient", "attempt": 1,
           "recipient_hash": "ab" * 16, "recipient_masked": "+1415*****71",
           "accepted_at": T0.replace(tzinfo=None), "updated_at": T0}
    console = Console(width=200, record=True, no_color=True)
    console.print(messages_table([messages.message_row(row)], "t"))
    text = console.export_text()
    assert "+1415*****71" in text and "ab" * 16 not in text and "2026-11-30 12:00:00.000" in text


class _Future:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def add_callbacks(self, ok: Callable[[Any], None], _err: Callable[[Any], None]) -> None:
        ok(self.rows)


class _Prepared:
    def __init__(self, cql: str) -> None:
        self.cql = cql
        self.consistency_level: Any = None


class FakeSession:
    """Answers the statements ``recent_messages`` runs from in-memory tables."""

    def __init__(self) -> None:
        self.index: dict[tuple[str, date], list[tuple[datetime, str]]] = {}
        self.messages: dict[str, dict[str, Any]] = {}
        self.queries = 0
        self._names = {cql: name for name, cql in STATEMENTS.items()}

    def prepare(self, cql: str) -> _Prepared:
        return _Prepared(cql)

    def add(self, tenant: str, at: datetime, mid: str, status: str = "QUEUED") -> None:
        self.index.setdefault((tenant, at.date()), []).append((at, mid))
        self.messages[mid] = {"message_id": mid, "tenant_id": tenant, "status": status,
                              "accepted_at": at}

    def _ordered(self, tenant: str, day: date) -> list[tuple[datetime, str]]:
        rows = self.index.get((tenant, day), [])
        return sorted(rows, key=lambda r: (-r[0].timestamp(), r[1]))

    def execute_async(self, stmt: _Prepared, params: tuple[Any, ...]) -> _Future:
        name = self._names.get(stmt.cql)
        self.queries += 1
        if name == "msg_get":
            row = self.messages.get(params[0])
            return _Future([dict(row)] if row else [])
        if name == "tenant_day_page":
            tenant, day, since, n = params
            rows = [r for r in self._ordered(tenant, day) if r[0] >= since]
        elif name == "tenant_day_ties":
            tenant, day, at, mid, n = params
            rows = [r for r in self._ordered(tenant, day) if r[0] == at and r[1] > mid]
        elif name == "tenant_day_older":
            tenant, day, at, since, n = params
            rows = [r for r in self._ordered(tenant, day) if since <= r[0] < at]
        else:
            raise AssertionError(f"unexpected statement {stmt.cql}")
        return _Future([{"created_at": a.replace(tzinfo=None), "message_id": m}
                        for a, m in rows[:n]])


def _store(session: FakeSession) -> CassandraStore:
    return CassandraStore(session, Settings())  # type: ignore[arg-type]


def _walk(store: CassandraStore, tenant: str, since: datetime, limit: int,
          status: Status | None = None, max_scan: int = 1000) -> list[list[str]]:
    pages: list[list[str]] = []
    after = None

    async def run() -> None:
        nonlocal after
        while True:
            page = await store.listing.recent_messages(tenant, since, limit=limit, now=T0,
                                                       status=status, after=after,
                                                       max_scan=max_scan)
            pages.append([m.message_id for m in page.messages])
            if page.next is None:
                return
            after = Cursor.decode(page.next.encode())

    asyncio.run(run())
    return pages


def test_recent_messages_pages_newest_first_across_days_with_ties() -> None:
    s = FakeSession()
    added = []
    for day in range(3):  # 3 days, 5 messages each, the last two at the same millisecond
        base = T0 - timedelta(days=day)
        for i in range(5):
            at = base - timedelta(minutes=min(i, 3))
            s.add("acme", at, f"m{day}{i}")
            added.append((at, f"m{day}{i}"))
    expected = [m for _, m in sorted(added, key=lambda r: (-r[0].timestamp(), r[1]))]
    s.add("globex", T0, "g1")
    pages = _walk(_store(s), "acme", T0 - timedelta(days=2, hours=1), limit=4)
    flat = [m for p in pages for m in p]
    assert flat == expected
    assert all(len(p) == 4 for p in pages[:-1])
    assert "g1" not in flat


def test_recent_messages_since_status_and_scan_bound() -> None:
    s = FakeSession()
    for i in range(30):
        s.add("acme", T0 - timedelta(minutes=i), f"m{i:02d}",
              "FAILED" if i % 10 == 0 else "DELIVERED")
    assert [m for p in _walk(_store(s), "acme", T0 - timedelta(minutes=4, seconds=30), 50)
            for m in p] == ["m00", "m01", "m02", "m03", "m04"]
    failed = _walk(_store(s), "acme", T0 - timedelta(hours=1), 50, Status.FAILED)
    assert [m for p in failed for m in p] == ["m00", "m10", "m20"]
    bounded = _walk(_store(s), "acme", T0 - timedelta(hours=1), 50, Status.FAILED, max_scan=7)
    assert len(bounded) >= 5 and [m for p in bounded for m in p] == ["m00", "m10", "m20"]
    s.messages["m01"]["tenant_id"] = "globex"  # never leaks, even if an index row were wrong
    assert "m01" not in [m for p in _walk(_store(s), "acme", T0 - timedelta(hours=1), 50)
                         for m in p]


class TransitionSession(FakeSession):
    """The message row ``m1`` answers ``msg_head``; status writes (``msg_advance``, or the
    compare-and-set ``msg_transition`` answering ``cas``) and failure index writes are
    recorded."""

    def __init__(self, row: dict[str, Any], cas: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.messages["m1"] = row
        self.cas = cas or {}
        self.writes: list[tuple[str, tuple[Any, ...]]] = []
        self.failures: list[tuple[Any, ...]] = []
        self._names.update({c: n for n, c in messages.OPERATOR_STATEMENTS.items()})

    def execute_async(self, stmt: _Prepared, params: tuple[Any, ...]) -> _Future:
        name = self._names.get(stmt.cql)
        if name == "msg_head":
            row = self.messages.get(params[0])
            return _Future([dict(row)] if row else [])
        if name in ("msg_advance", "msg_transition"):
            self.writes.append((name, params))
            return _Future([self.cas] if name == "msg_transition" else [])
        if name == "failure_insert":
            self.failures.append(params)
            return _Future([])
        return super().execute_async(stmt, params)


CREATED_WT = 1_790_000_000_000_000


def _row(status: Status, *, status_wt: int | None = None) -> dict[str, Any]:
    from notiflow.schemas.status import rank, write_offset_us

    r = rank(status, 2)
    offset = write_offset_us(r)
    assert offset is not None
    return {"message_id": "m1", "tenant_id": "acme", "tier": "P1", "channel": "SMS",
            "category": "otp", "status": status.value, "status_rank": r,
            "reason": "stored_reason", "attempt": 2, "provider_id": "twilio",
            "updated_at": (T0 - timedelta(seconds=5)).replace(tzinfo=None),
            "created_wt": CREATED_WT,
            "status_wt": CREATED_WT + offset if status_wt is None else status_wt}


def _transition(row: dict[str, Any] | None, status: Status, now: datetime,
                cas: dict[str, Any] | None = None) -> TransitionSession:
    s = TransitionSession(row or {}, cas)
    if row is None:
        del s.messages["m1"]
    store = _store(s)

    async def write_all(writes: list[tuple[str, tuple[Any, ...]]]) -> None:
        for name, params in writes:
            s.execute_async(_Prepared(STATEMENTS.get(
                name) or messages.OPERATOR_STATEMENTS[name]), params)

    store.cql.write_all = write_all  # type: ignore[method-assign]
    s.result = asyncio.run(  # type: ignore[attr-defined]
        store.messages.transition("m1", status, 2, "invalid_recipient", now, "twilio"))
    return s


def test_failure_index_written_once_per_transition_and_on_replay_with_the_same_key() -> None:
    now = T0 + timedelta(microseconds=123456)
    [applied] = _transition(_row(Status.PROVIDER_ACCEPTED), Status.FAILED, now).failures
    assert applied[:6] == ("P1", T0.date(), operator_shard("m1"),
                           T0 + timedelta(microseconds=123000), "m1", "FAILED")
    assert applied[6:] == ("invalid_recipient", "acme", "SMS", "otp", 2, "twilio")
    # a replay (not applied, the row still FAILED): the row's own transition time is the key
    [replayed] = _transition(_row(Status.FAILED), Status.FAILED, now).failures
    assert replayed[3] == T0 - timedelta(seconds=5) and replayed[6] == "stored_reason"
    # superseded (DELIVERED wins over FAILED): nothing; not a failure status: nothing
    assert _transition(_row(Status.DELIVERED), Status.FAILED, now).failures == []
    assert _transition(_row(Status.QUEUED), Status.PROVIDER_ACCEPTED, now).failures == []


def test_transition_writes_at_creation_time_plus_rank_and_never_regresses() -> None:
    from notiflow.schemas.status import rank, write_offset_us

    now = T0
    up = _transition(_row(Status.QUEUED), Status.PROVIDER_ACCEPTED, now)
    [(name, params)] = up.writes
    r = rank(Status.PROVIDER_ACCEPTED, 2)
    assert (name, params[0], params[1], params[2]) == ("msg_advance",
                                                        CREATED_WT + write_offset_us(r),
                                                        "PROVIDER_ACCEPTED", r)
    assert up.result == (True, True)  # type: ignore[attr-defined]
    down = _transition(_row(Status.DELIVERED), Status.PROVIDER_ACCEPTED, now)
    assert down.writes == [] and down.result == (False, True)  # type: ignore[attr-defined]
    missing = _transition(None, Status.PROVIDER_ACCEPTED, now)
    assert missing.writes == [] and missing.result == (False, False)  # type: ignore[attr-defined]


def test_a_row_written_by_compare_and_set_keeps_that_path() -> None:
    legacy = _row(Status.QUEUED, status_wt=CREATED_WT + 7_654_321_000)
    s = _transition(legacy, Status.PROVIDER_ACCEPTED, T0, cas={"[applied]": True})
    assert [n for n, _ in s.writes] == ["msg_transition"]
    assert s.result == (True, True)  # type: ignore[attr-defined]


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(list(Status)), st.integers(0, 5)), min_size=1,
                max_size=8),
       st.randoms(use_true_random=False))
def test_rank_write_times_converge_on_the_highest_rank_in_any_interleaving(
        moves: list[tuple[Status, int]], rnd: Any) -> None:
    """Writers read the row, then write later, in any interleaving (each read may be stale):
    last-write-wins by write time leaves the highest rank any writer wrote, which is the
    highest rank offered (or the initial one)."""
    from notiflow.adapters.cassandra.messages import rank_write_time
    from notiflow.schemas.status import OFFSET_CLASS_US, rank, write_offset_us

    initial = rank(Status.QUEUED)
    cell = (CREATED_WT, initial)
    pending: list[tuple[int, int]] = []
    todo = list(moves)
    while todo or pending:
        if todo and (not pending or rnd.random() < 0.5):
            status, attempt = todo.pop(0)
            r = rank(status, attempt)
            head = MessageHeadRow(created_wt=CREATED_WT, status_wt=cell[0], status_rank=cell[1])
            at = rank_write_time(head, r)
            assert at is not None
            if cell[1] < r:
                pending.append((at, r))
        else:
            at, r = pending.pop(rnd.randrange(len(pending)))
            cell = max(cell, (at, r))
    assert cell[1] == max([initial, *(rank(st_, a) for st_, a in moves)])
    assert cell[0] == CREATED_WT + write_offset_us(cell[1]) or cell == (CREATED_WT, initial)
    assert cell[0] - CREATED_WT <= 13 * OFFSET_CLASS_US


def test_operator_shard_is_stable() -> None:
    assert operator_shard("msg_1") == operator_shard("msg_1")
    assert {operator_shard(f"msg_{i}") for i in range(1000)} == set(range(32))


# ------------------------------------------------------------------------ ops/queries.md


def documented_queries() -> list[str]:
    text = (ROOT / "ops" / "queries.md").read_text()
    return [q.strip() for q in re.findall(r"```sql\n(.*?)```", text, flags=re.S)]


def test_queries_doc_has_no_allow_filtering_and_names_known_tables() -> None:
    queries = documented_queries()
    assert len(queries) >= 10
    tables = {"messages", "message_events", "attempts", "provider_messages",
              "messages_by_tenant_day", "failures_by_tier_day", "provider_outcomes_by_hour"}
    for q in queries:
        assert "ALLOW FILTERING" not in q.upper()
        assert q.endswith(";") and q.count(";") == 1
        m = re.search(r"FROM notiflow\.(\w+)", q)
        assert m and m.group(1) in tables, q
        assert set(re.findall(r"<(\w+)>", q)) <= {
            "message_id", "provider_id", "provider_message_id", "tenant_id", "day", "since",
            "tier", "from", "to", "hour"}, q
    for table in tables:
        assert any(f"FROM notiflow.{table} " in q for q in queries), table
