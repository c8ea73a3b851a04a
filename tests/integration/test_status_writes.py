"""Status writes on real Cassandra: transitions timed by rank converge on the highest status in
any order, rows whose status was written by compare-and-set keep that path, creation is a
fill-if-absent, and receipts are recorded once; with one request per call and with the calls
of a loop turn coalesced (the reconciler's store)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.cluster import Session

from notiflow.adapters.cassandra.idempotency import OutboxSlot
from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.schemas.enums import Category, Channel, Status, Tier
from notiflow.schemas.messages import MessageSnapshot
from notiflow.schemas.status import rank
from notiflow.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["one request each", "coalesced"])
def store(stack: Settings, request: pytest.FixtureRequest) -> Iterator[CassandraStore]:
    """The plain store, and the reconciler's (reads and writes of one loop turn shared)."""
    cluster, session = connect(stack)
    plain = CassandraStore(session, stack)
    yield plain if request.param == "one request each" else plain.coalesce(max_keys=3,
                                                                           max_rows=4)
    cluster.shutdown()


def snap(accepted_at: datetime) -> MessageSnapshot:
    return MessageSnapshot(tenant_id="acme", channel=Channel.SMS, tier=Tier.P2,
                           category=Category.ACCOUNT, template_id="otp", template_version=1,
                           recipient_hash="h" * 16, recipient_masked="+1******71",
                           accepted_at=accepted_at)


def row(cql: Session, mid: str) -> dict[str, object]:
    return cql.execute("SELECT status, status_rank, attempt, provider_id FROM messages "
                       "WHERE message_id = %s", (mid,)).one()


MOVES = [(Status.PROVIDER_ACCEPTED, 1), (Status.SENT, 1), (Status.DELIVERED, 1),
         (Status.FAILED, 1), (Status.UNKNOWN, 1), (Status.QUEUED, 2),
         (Status.PROVIDER_ACCEPTED, 2)]


@pytest.mark.parametrize("seed", range(4))
async def test_concurrent_transitions_in_any_order_end_at_the_highest_rank(
        store: CassandraStore, cql: Session, seed: int) -> None:
    mid = f"sw-{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    assert await store.messages.create_message(mid, snap(now - timedelta(seconds=3)),
                                               Status.QUEUED, now)
    moves = MOVES[:]
    random.Random(seed).shuffle(moves)
    results = await asyncio.gather(*(store.messages.transition(mid, s, a, None, now, "twilio")
                                     for s, a in moves))
    top_status, top_attempt = max(MOVES, key=lambda m: rank(*m))
    assert row(cql, mid)["status"] == top_status.value
    assert row(cql, mid)["status_rank"] == rank(top_status, top_attempt)
    assert all(exists for _, exists in results)
    assert results[moves.index((top_status, top_attempt))][0] is True
    # later, one at a time: nothing lower applies, the row never moves back
    for s, a in MOVES:
        applied, exists = await store.messages.transition(mid, s, a, None, now)
        assert exists and not applied
    assert row(cql, mid)["status"] == top_status.value


async def test_a_compare_and_set_row_keeps_that_path_and_never_regresses(
        store: CassandraStore, cql: Session) -> None:
    """A row whose status cells carry an ordinary write time (an older release's
    compare-and-set, or a DLQ replay's re-queue) must not be outranked by a rank timestamp
    below it: it keeps using compare-and-set."""
    mid = f"sw-{uuid.uuid4().hex}"
    accepted = datetime.now(UTC) - timedelta(minutes=5)
    await store.messages.create_message(mid, snap(accepted), Status.QUEUED, accepted)
    cql.execute("UPDATE messages SET status = 'SENT', status_rank = %s WHERE message_id = %s "
                "IF status_rank < %s", (rank(Status.SENT, 1), mid, rank(Status.SENT, 1)))
    head = await store.messages.head(mid)
    assert head is not None and head.status_wt > head.created_wt + rank(Status.SENT, 1)
    now = datetime.now(UTC)
    assert await store.messages.transition(mid, Status.PROVIDER_ACCEPTED, 1, None,
                                           now) == (False, True)
    assert await store.messages.transition(mid, Status.DELIVERED, 1, None, now) == (True, True)
    assert row(cql, mid)["status"] == "DELIVERED"


async def test_a_dlq_replay_right_after_a_failure_reopens_the_message(
        store: CassandraStore, cql: Session) -> None:
    """A failure written by rank a moment after acceptance, then a DLQ replay's re-queue
    (compare-and-set at the wall clock) and the replay's own failure: rank write times stay
    within 0.13 s of acceptance, so a replay (which needs a dead letter first: seconds at
    the least) is never shadowed by them."""
    mid = f"sw-{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    await store.messages.create_message(mid, snap(now - timedelta(seconds=1)), Status.QUEUED, now)
    assert await store.messages.transition(mid, Status.FAILED, 5, "boom", now) == (True, True)
    requeued = cql.execute(
        "UPDATE messages SET status = 'QUEUED', status_rank = %s, attempt = 6 "
        "WHERE message_id = %s IF status_rank = %s",
        (rank(Status.QUEUED), mid, rank(Status.FAILED))).one()
    assert requeued["[applied]"]
    assert row(cql, mid)["status"] == "QUEUED"
    assert await store.messages.transition(mid, Status.FAILED, 10, "boom again",
                                           datetime.now(UTC)) == (True, True)
    assert (row(cql, mid)["status"], row(cql, mid)["attempt"]) == ("FAILED", 10)


async def test_creation_fills_an_absent_row_only(store: CassandraStore, cql: Session) -> None:
    mid = f"sw-{uuid.uuid4().hex}"
    now = datetime.now(UTC)
    assert await store.messages.transition(mid, Status.SENT, 1, None, now) == (False, False)
    assert row(cql, mid) is None
    assert await store.messages.create_message(mid, snap(now), Status.QUEUED, now) is True
    assert await store.messages.transition(mid, Status.SENT, 1, None, now) == (True, True)
    assert await store.messages.create_message(mid, snap(now), Status.QUEUED, now) is False
    assert row(cql, mid)["status"] == "SENT"
    history = [r["status"] for r in cql.execute(
        "SELECT status FROM message_events WHERE message_id = %s", (mid,))]
    assert history == ["QUEUED"]


async def test_a_receipt_is_recorded_once(store: CassandraStore, cql: Session) -> None:
    event = uuid.uuid4().hex
    now = datetime.now(UTC)

    async def seen(at: datetime) -> bool:
        row = await store.delivery.receipt_record("twilio", event)
        await store.write_all(store.delivery.receipt_writes("twilio", event, "m-1",
                                                            Status.DELIVERED, at, row))
        return row is not None

    assert await seen(now) is False
    assert await seen(now + timedelta(seconds=5)) is True
    stored = cql.execute("SELECT message_id, status FROM receipts_dedup WHERE provider_id = "
                         "'twilio' AND provider_event_id = %s", (event,)).one()
    assert (stored["message_id"], stored["status"]) == ("m-1", "DELIVERED")


async def test_creation_carries_further_writes_in_either_case(store: CassandraStore,
                                                              cql: Session) -> None:
    """The API's acceptance writes its outbox row with the message row (one request), and
    settles the key and the outbox row together."""
    mid, key = f"sw-{uuid.uuid4().hex}", f"k-{uuid.uuid4().hex}"
    now = datetime.now(UTC).replace(microsecond=0)
    slot = OutboxSlot(OutboxSlot.bucket_of(now), 1_000 + random.randrange(1_000))

    def outbox() -> list[str]:
        return [r["idempotency_key"] for r in cql.execute(
            "SELECT idempotency_key FROM outbox_buckets WHERE bucket = %s AND shard = %s",
            (slot.bucket, slot.shard))]

    first = store.idempotency.outbox_write(slot, now, "acme", key)
    assert await store.messages.create_message(mid, snap(now), Status.QUEUED, now,
                                               also=[first]) is True
    assert row(cql, mid)["status"] == "QUEUED" and outbox() == [key]
    again = store.idempotency.outbox_write(slot, now + timedelta(seconds=1), "acme", key + "-again")
    assert await store.messages.create_message(mid, snap(now), Status.QUEUED, now,
                                               also=[again]) is False
    assert sorted(outbox()) == sorted([key, key + "-again"])

    assert (await store.idempotency.reserve("acme", key, "hash", mid, "topic", "{}", now)).applied
    await store.idempotency.settle_reservation("acme", key, '{"ok": true}', slot, now)
    assert outbox() == [key + "-again"]
    settled = await store.idempotency.get_reservation("acme", key)
    assert settled is not None
    assert (settled.state, settled.response) == ("ACCEPTED", '{"ok": true}')
