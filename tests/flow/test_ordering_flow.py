"""Strict ordering through the whole send flow (1 and 2 workers): messages of one
``(tenant, ordering_key)`` reach the provider in acceptance order although their recipients
spread them over the workers and the provider answers in random time; a retrying message
holds up the later messages of its key only, until its retry (a second run, resumed from
the first one's recovery store) has been sent. On memory ports."""

from __future__ import annotations

import asyncio
import random
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from bytewax.recovery import RecoveryConfig, init_db_dir
from bytewax.testing import TestingSource, cluster_main, run_main

from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings
from tests.flow.conftest import MemorySend, decode, kmsg, record

pytestmark = pytest.mark.flow


class Recorder:
    """A provider account that accepts after a random delay, refuses the first attempt of
    the messages in ``fail_once`` (transient), and records the order of its calls."""

    def __init__(self, provider_id: str, calls: list[str], fail_once: set[str]) -> None:
        self.provider_id = provider_id
        self.channel = Channel.SMS
        self.calls = calls
        self.fail_once = fail_once
        self._lock = threading.Lock()

    async def send(self, message: OutboundMessage) -> SendResult:
        with self._lock:
            self.calls.append(f"{message.message_id}#{message.attempt}")
        await asyncio.sleep(random.uniform(0, 0.03))
        now = datetime.now(UTC)
        if message.message_id in self.fail_once and message.attempt == 1:
            return SendResult(Outcome.TRANSIENT, self.provider_id, now, now, reason="http_503",
                              error_code="http_503")
        return SendResult(Outcome.ACCEPTED, self.provider_id, now, now,
                          provider_message_id=uuid.uuid4().hex)

    async def aclose(self) -> None:
        return None


def record_with(mem: MemorySend, calls: list[str], fail_once: set[str]) -> None:
    """Every SMS account of ``mem`` is a :class:`Recorder` from now on."""
    for pid in ("twilio", "vonage"):
        mem.state.providers[pid] = Recorder(pid, calls, fail_once)


def run(flow: Any, workers: int, store: Path) -> None:
    config = RecoveryConfig(str(store))
    if workers == 1:
        run_main(flow, epoch_interval=timedelta(0), recovery_config=config)
    else:
        cluster_main(flow, [], 0, worker_count_per_proc=workers,
                     epoch_interval=timedelta(0), recovery_config=config)


def message_id(code: str) -> str:
    return f"msg_{code}"


@pytest.mark.parametrize("workers", [1, 2])
def test_one_key_reaches_the_provider_in_order_and_a_retry_holds_only_its_key(
        settings: Settings, memory_send: Callable[..., MemorySend], tmp_path: Path,
        workers: int) -> None:
    mem = memory_send()
    run_id = uuid.uuid4().hex[:8]
    key_a, key_b = f"thread-a-{run_id}", f"thread-b-{run_id}"

    def item(i: int, code: str, key: str | None) -> Any:
        extra: dict[str, object] = {"message_id": message_id(code),
                                    "recipient": f"+1415555{i:04d}",
                                    "accepted_at": datetime.now(UTC).isoformat()}
        if key is not None:
            extra["ordering_key"] = key
        return kmsg(settings, record(code, **extra), offset=i,
                    key=(f"acme:{key}" if key else code).encode())

    a = [f"{run_id}a{i}" for i in range(6)]
    b = [f"{run_id}b{i}" for i in range(3)]
    u = [f"{run_id}u{i}" for i in range(3)]
    items = [item(0, a[0], key_a), item(1, b[0], key_b), item(2, a[1], key_a),
             item(3, u[0], None), item(4, a[2], key_a), item(5, b[1], key_b),
             item(6, a[3], key_a), item(7, u[1], None), item(8, a[4], key_a),
             item(9, b[2], key_b), item(10, a[5], key_a), item(11, u[2], None)]
    calls: list[str] = []
    fail_once = {message_id(a[2])}
    store = tmp_path / "recovery"
    store.mkdir()
    init_db_dir(store, 1)

    out: list[OutRecord] = []
    record_with(mem, calls, fail_once)
    flow = mem.flow(TestingSource(list(items)), out)
    run(flow, workers, store)

    first = [c.split("#")[0] for c in calls]
    assert [m for m in first if m in map(message_id, a)] == [message_id(x) for x in a[:3]]
    assert [m for m in first if m in map(message_id, b)] == [message_id(x) for x in b]
    assert {m for m in first if m in map(message_id, u)} == set(map(message_id, u))
    events, _, retries = decode(settings, out)
    [retry] = retries
    assert retry.message_id == message_id(a[2]) and retry.attempt == 2
    assert not {e.message_id for e in events} & {message_id(x) for x in a[3:]}

    due = retry.model_copy(update={"not_before": None})
    again = kmsg(settings, orjson.dumps(due.model_dump(mode="json", exclude_none=True)),
                 offset=len(items), key=f"acme:{key_a}".encode())
    calls.clear()
    out2: list[OutRecord] = []
    record_with(mem, calls, set())
    flow = mem.flow(TestingSource([*items, again]), out2)
    run(flow, workers, store)

    assert calls == [f"{message_id(x)}#{1 if x != a[2] else 2}" for x in a[2:]]
    events2, _, _ = decode(settings, out2)
    accepted = [e.message_id for e in events2 if e.status.value == "PROVIDER_ACCEPTED"]
    assert accepted == [message_id(x) for x in a[2:]]
