"""The settler: settles queued during an interval are written together, answered from the
queue while pending, failures left to the sweeper, everything written on close."""

from __future__ import annotations

import asyncio

import pytest
from cassandra import OperationTimedOut

from notiflow.gateway.settler import Settler
from tests.helpers import wait_until


class Store:
    def __init__(self, fail: bool = False) -> None:
        self.written: list[str] = []
        self.started: list[str] = []
        self.fail = fail
        self.gate = asyncio.Event()
        self.gate.set()

    def settle(self, key: str) -> object:
        async def run() -> None:
            self.started.append(key)
            await self.gate.wait()
            if self.fail:
                raise OperationTimedOut("down")
            self.written.append(key)
        return run


async def test_settles_of_one_interval_go_together() -> None:
    store = Store()
    settler = Settler(0.01)
    for key in ("a", "b", "c"):
        settler.add("acme", key, f'{{"message_id":"{key}"}}', store.settle(key))
    assert settler.pending("acme", "b") == '{"message_id":"b"}'
    assert settler.pending("other", "b") is None
    assert store.written == []
    await wait_until(lambda: len(store.written) >= 3, timeout=1.0, what="the interval's flush")
    assert sorted(store.written) == ["a", "b", "c"]
    assert settler.pending("acme", "b") is None and len(settler) == 0


async def test_pending_while_being_written_and_no_second_write() -> None:
    store = Store()
    store.gate.clear()
    settler = Settler(0.0)
    settler.add("acme", "a", "A", store.settle("a"))
    await wait_until(lambda: "a" in store.started, timeout=1.0, what="a being written")
    assert settler.pending("acme", "a") == "A"
    settler.add("acme", "b", "B", store.settle("b"))
    await wait_until(lambda: "b" in store.started, timeout=1.0, what="b being written")
    store.gate.set()
    await settler.close()
    assert sorted(store.written) == ["a", "b"]
    assert len(settler) == 0


async def test_failed_settle_is_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    store = Store(fail=True)
    settler = Settler(0.0)
    settler.add("acme", "a", "A", store.settle("a"))
    await wait_until(lambda: "deferred to the sweeper" in caplog.text, timeout=1.0,
                     what="the failed settle logged")
    assert settler.pending("acme", "a") is None
    assert "deferred to the sweeper (OperationTimedOut)" in caplog.text


async def test_close_writes_what_is_queued() -> None:
    store = Store()
    settler = Settler(60.0)
    settler.add("acme", "a", "A", store.settle("a"))
    await settler.close()
    assert store.written == ["a"]
