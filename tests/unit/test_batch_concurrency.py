"""Batch items of every batch in a process share one bound (``api_batch_concurrency``): the
event loop's queue stays short however many batches arrive at once."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import Response

from notiflow.gateway import batch
from notiflow.settings import TenantConfig
from tests.helpers import loop_turns


async def test_concurrent_batches_share_the_process_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    running = peak = 0

    async def accept(*_args: Any) -> Response:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await loop_turns(3)
        running -= 1
        return Response('{"message_id":"m"}', status_code=202)

    monkeypatch.setattr(batch, "accept_request", accept)
    rt: Any = SimpleNamespace(batch_items=asyncio.Semaphore(16))
    tenant = TenantConfig(id="acme", token="t" * 32)  # type: ignore[arg-type]
    batches = [asyncio.gather(*(batch._item(rt, tenant, {"n": i}, None) for i in range(100)))
               for _ in range(3)]
    results = await asyncio.gather(*batches)
    assert peak == 16
    assert [r["code"] for b in results for r in b] == [202] * 300
