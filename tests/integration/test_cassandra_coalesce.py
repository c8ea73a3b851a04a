"""The reconciler's request coalescing on real Cassandra: the reads and writes of one event-loop
turn share ``IN`` queries and unlogged batches within their bounds, every caller gets its own
answer, and a failed request fails only the callers it served."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from cassandra.cluster import ResponseFuture, Session
from cassandra.query import BatchStatement

from notiflow.adapters.cassandra.session import aio, connect
from notiflow.adapters.cassandra_coalesce import CassandraCoalescer, KeyedRead
from notiflow.settings import Settings
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def session(stack: Settings) -> Iterator[Session]:
    cluster, s = connect(stack)
    s.execute("CREATE TABLE IF NOT EXISTS coalesce_probe (k text, p text, v int, "
              "PRIMARY KEY ((k, p)))")
    yield s
    cluster.shutdown()


class Counting:
    """``aio`` that records each request: a read, a single write, or a batch of n rows."""

    def __init__(self) -> None:
        self.sizes: list[tuple[str, int]] = []

    def __call__(self, rf: ResponseFuture) -> asyncio.Future[list[dict[str, Any]]]:
        query = rf.query
        if isinstance(query, BatchStatement):
            self.sizes.append(("batch", len(query._statements_and_parameters)))
        elif query.prepared_statement.query_string.startswith("SELECT"):
            self.sizes.append(("read", 1))
        else:
            self.sizes.append(("write", 1))
        return aio(rf)


def probe(session: Session) -> tuple[KeyedRead, Any]:
    read = KeyedRead(session.prepare("SELECT p, v FROM coalesce_probe WHERE k = ? AND p IN ?"),
                     "p")
    return read, session.prepare("INSERT INTO coalesce_probe (k, p, v) VALUES (?, ?, ?)")


async def test_one_turns_reads_share_in_queries_and_each_caller_gets_its_row(
        session: Session) -> None:
    read, insert = probe(session)
    k = uuid.uuid4().hex
    for i in range(0, 10, 2):
        session.execute(insert, (k, f"p{i}", i))
    counting = Counting()
    co = CassandraCoalescer(session, counting, max_keys=4, max_rows=8)
    keys = [f"p{i}" for i in range(10)] + ["p2", "p3"]
    rows = await asyncio.gather(*(co.read(read, (k,), p) for p in keys))
    assert [r and r["v"] for r in rows] == [0, None, 2, None, 4, None, 6, None, 8, None, 2,
                                            None]
    assert counting.sizes == [("read", 1)] * 3
    other = await co.read(read, (uuid.uuid4().hex,), "p0")
    assert other is None


async def test_one_turns_writes_share_batches_within_the_row_bound(session: Session) -> None:
    read, insert = probe(session)
    k = uuid.uuid4().hex
    counting = Counting()
    co = CassandraCoalescer(session, counting, max_keys=50, max_rows=5)
    callers = [[(insert, (k, f"c{c}r{r}", c * 100 + r)) for r in range(n)]
               for c, n in enumerate([2, 3, 1, 12, 4])]
    await asyncio.gather(*(co.write(w) for w in callers))
    assert all(n <= 5 for _, n in counting.sizes)
    assert sum(n for _, n in counting.sizes) == 22 and len(counting.sizes) < 10
    stored = {r["p"]: r["v"] for r in session.execute(
        read.statement, (k, [f"c{c}r{r}" for c in range(5) for r in range(12)]))}
    assert stored == {f"c{c}r{r}": c * 100 + r for c, n in enumerate([2, 3, 1, 12, 4])
                      for r in range(n)}
    assert co._parts == {}
    assert await co.write([]) is None


async def test_a_failed_batch_fails_only_its_callers(session: Session) -> None:
    _, insert = probe(session)
    k = uuid.uuid4().hex
    co = CassandraCoalescer(session, aio, max_keys=50, max_rows=2)
    good_a = co.write([(insert, (k, "a", 1)), (insert, (k, "b", 2))])
    bad = co.write([(insert, (k, "c", "not an int"))])
    good_b = co.write([(insert, (k, "d", 4)), (insert, (k, "e", 5))])
    results = await asyncio.gather(good_a, bad, good_b, return_exceptions=True)
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], Exception)
    assert {r["p"] for r in session.execute(
        "SELECT p FROM coalesce_probe WHERE k = %s AND p IN ('a', 'b', 'c', 'd', 'e')",
        (k,))} == {"a", "b", "d", "e"}


async def test_a_caller_split_over_batches_waits_for_all_of_them(session: Session) -> None:
    _, insert = probe(session)
    k = uuid.uuid4().hex
    co = CassandraCoalescer(session, aio, max_keys=50, max_rows=3)
    bad_tail = [(insert, (k, f"s{i}", i)) for i in range(6)] + [(insert, (k, "s6", "x"))]
    with pytest.raises(Exception):  # noqa: B017 (the driver's bind error)
        await co.write(bad_tail)
    await wait_until(lambda: co._parts == {}, timeout=5, what="the failed parts cleared")
    assert co._parts == {}
    done = co.write([(insert, (k, f"t{i}", i)) for i in range(7)])
    assert await done is None
    assert len(list(session.execute(
        "SELECT p FROM coalesce_probe WHERE k = %s AND p IN ('t0','t1','t2','t3','t4','t5',"
        "'t6')", (k,)))) == 7
