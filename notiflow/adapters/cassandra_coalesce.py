"""Reads and writes many coroutines issue during one turn of the event loop, sent to Cassandra
as few requests: reads by partition key become ``IN`` queries, idempotent writes become
unlogged batches.

The reconciler applies a Kafka batch as one coroutine per message (read the row, then write
its status, history, attempt and index rows). Sent one request per read and one batch per
message, Cassandra's per-request cost was the largest item of the end-to-end CPU
(``python -m notiflow.bench.cassandra_requests``, two runs: a head read cost Cassandra 2 to 7
times as much alone as inside an ``IN`` of ten keys and the client 7 to 10 times as much; a
message's eight-row batch cost Cassandra 1.2 to 3 times as much as the same rows inside a
ten-message batch).

Contract: each caller awaits its own result. A failed request fails every caller it served
(the reconciler retries its whole Kafka batch; its writes are idempotent upserts). A caller's
writes stay in one batch unless they alone exceed ``max_rows``. Requests go to the
coordinator the driver's load-balancing policy picks, as single requests do; on a multi-node
cluster each ``IN`` key and each batched row is forwarded to its replicas by that coordinator.
Batches are bounded by rows (64 rows measured 15.5 KiB in ``bench``): keep ``max_rows`` times
the row size under Cassandra's ``batch_size_fail_threshold`` (50 KiB by default).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cassandra.cluster import ResponseFuture, Session
from cassandra.query import BatchStatement, BatchType, PreparedStatement

Row = dict[str, Any]
Aio = Callable[[ResponseFuture], "asyncio.Future[list[Row]]"]
Stmt = tuple[PreparedStatement, Sequence[Any]]
Caller = tuple[list[Stmt], "asyncio.Future[None]"]
"""One caller's writes (part of them, once split) and the future it awaits."""


@dataclass(frozen=True)
class KeyedRead:
    """A read of whole partitions by key. ``statement`` binds ``(*prefix, [last, ...])``
    (``... AND last_column IN ?``); ``last_column`` names the column that tells which key a
    returned row belongs to."""

    statement: PreparedStatement
    last_column: str


class CassandraCoalescer:
    """Coalesces :meth:`read` and :meth:`write` calls made in one event-loop turn."""

    def __init__(self, session: Session, aio: Aio, *, max_keys: int = 32,
                 max_rows: int = 64, max_requests: int = 16) -> None:
        self.session = session
        self.aio = aio
        self.max_keys = max_keys
        self.max_rows = max_rows
        self.max_requests = max_requests
        self._sem: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._reads: dict[tuple[KeyedRead, tuple[Any, ...]],
                          dict[Any, list[asyncio.Future[Row | None]]]] = {}
        self._writes: list[Caller] = []
        self._parts: dict[asyncio.Future[None], int] = {}
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def read(self, query: KeyedRead, prefix: tuple[Any, ...], key: Any
             ) -> asyncio.Future[Row | None]:
        """The row of partition ``(*prefix, key)``, None when there is none."""
        fut: asyncio.Future[Row | None] = asyncio.get_running_loop().create_future()
        self._reads.setdefault((query, prefix), {}).setdefault(key, []).append(fut)
        self._schedule()
        return fut

    def write(self, writes: Sequence[Stmt]) -> asyncio.Future[None]:
        """Resolves when every one of ``writes`` (idempotent upserts) is acknowledged."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if not writes:
            fut.set_result(None)
            return fut
        self._writes.append((list(writes), fut))
        self._schedule()
        return fut

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        reads, self._reads = self._reads, {}
        writes, self._writes = self._writes, []
        for (query, prefix), waiting in reads.items():
            keys = list(waiting)
            for i in range(0, len(keys), self.max_keys):
                chunk = {k: waiting[k] for k in keys[i:i + self.max_keys]}
                self._spawn(self._read(query, prefix, chunk))
        batches = self._pack(writes)
        for batch in batches:
            for _, fut in batch:
                self._parts[fut] = self._parts.get(fut, 0) + 1
        for batch in batches:
            self._spawn(self._write(batch))

    def _pack(self, writes: list[Caller]) -> list[list[Caller]]:
        """Callers' writes into batches of at most ``max_rows`` rows (a caller with more
        rows than that is split over several batches)."""
        batches: list[list[Caller]] = [[]]
        rows = 0
        for stmts, fut in writes:
            for i in range(0, len(stmts), self.max_rows):
                part = stmts[i:i + self.max_rows]
                if rows and rows + len(part) > self.max_rows:
                    batches.append([])
                    rows = 0
                batches[-1].append((part, fut))
                rows += len(part)
        return [b for b in batches if b]

    def _requests(self) -> asyncio.Semaphore:
        """The bound on requests in flight, of the running loop."""
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem[0] is not loop:
            self._sem = (loop, asyncio.Semaphore(self.max_requests))
        return self._sem[1]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, query: KeyedRead, prefix: tuple[Any, ...],
                    waiting: dict[Any, list[asyncio.Future[Row | None]]]) -> None:
        try:
            async with self._requests():
                rows = await self.aio(self.session.execute_async(
                    query.statement, (*prefix, list(waiting))))
        except BaseException as exc:
            for futs in waiting.values():
                _fail(futs, exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        found = {row[query.last_column]: row for row in rows}
        for key, futs in waiting.items():
            for fut in futs:
                if not fut.done():
                    fut.set_result(found.get(key))

    async def _write(self, parts: list[Caller]) -> None:
        futs = [fut for _, fut in parts]
        try:
            async with self._requests():
                stmts = [s for part, _ in parts for s in part]
                if len(stmts) == 1:
                    await self.aio(self.session.execute_async(*stmts[0]))
                else:
                    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
                    for stmt, params in stmts:
                        batch.add(stmt, params)
                    await self.aio(self.session.execute_async(batch))
        except BaseException as exc:
            _fail(futs, exc)
            for fut in futs:
                self._part_done(fut)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for fut in futs:
            self._part_done(fut)

    def _part_done(self, fut: asyncio.Future[None]) -> None:
        remaining = self._parts[fut] - 1
        if remaining:
            self._parts[fut] = remaining
            return
        del self._parts[fut]
        if not fut.done():
            fut.set_result(None)


def _fail(futs: Sequence[asyncio.Future[Any]], exc: BaseException) -> None:
    for fut in futs:
        if not fut.done():
            fut.set_exception(exc)
