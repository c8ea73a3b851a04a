"""A worker's event loop closes cleanly even when a batch left helper tasks behind."""

from __future__ import annotations

import asyncio

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
