"""A worker's event loop closes cleanly even when a batch left helper tasks behind."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from notiflow.adapters import worker
from notiflow.adapters.worker import WorkerLoop
from tests.helpers import loop_turns


class _Resource:
    closed = False

    async def aclose(self) -> None:
        self.closed = True


def test_close_closes_resources_then_cancels_what_a_batch_left_pending() -> None:
    loop = WorkerLoop()
    resource = loop.resource("r", lambda: _make())
    left: list[asyncio.Task[None]] = []
    finished: list[str] = []

    async def helper() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            finished.append("helper")

    async def batch() -> int:
        left.append(asyncio.ensure_future(helper()))
        await loop_turns()
        return 1

    assert loop.run(batch()) == 1
    loop.close()
    assert resource.closed and left[0].cancelled() and finished == ["helper"]


async def _make() -> _Resource:
    return _Resource()


class _Stuck:
    async def aclose(self) -> None:
        await asyncio.Event().wait()


async def _stuck() -> _Stuck:
    return _Stuck()


def test_close_never_hangs_on_a_stuck_close_or_a_task_that_ignores_cancellation(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(worker, "CLOSE_WAIT_S", 0.05)
    loop = WorkerLoop()
    loop.resource("stuck", _stuck)

    async def stubborn() -> None:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()

    async def batch() -> None:
        asyncio.ensure_future(stubborn(), loop=asyncio.get_running_loop()).set_name("stubborn")
        await loop_turns()

    loop.run(batch())
    loop.close()
    assert "closing stuck took over" in caplog.text
    assert "task 'stubborn' did not end" in caplog.text
