"""The API's view of which topics exist (the outbox sweeper parks entries bound for a topic
that is gone): cached, fetched again for a topic it lacks once the list is a few seconds
old, None while the broker does not answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from notiflow.gateway import runtime as runtime_module
from notiflow.gateway.runtime import Runtime
from notiflow.settings import Settings


class Admin:
    def __init__(self) -> None:
        self.topics = {"ingest.sms.p1"}
        self.calls = 0
        self.down = False

    def list_topics(self, timeout: float) -> Any:
        self.calls += 1
        if self.down:
            raise RuntimeError("no broker")
        return SimpleNamespace(topics={t: None for t in self.topics})


class Loop:
    def __init__(self) -> None:
        self.now = 100.0

    def time(self) -> float:
        return self.now


async def test_the_topic_list_is_cached_and_refetched_for_a_topic_it_lacks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop = Loop()
    monkeypatch.setattr(runtime_module.asyncio, "get_running_loop", lambda: loop)

    async def in_thread(fn: Any, *args: Any, **kw: Any) -> Any:
        return fn(*args, **kw)

    monkeypatch.setattr(runtime_module.asyncio, "to_thread", in_thread)
    rt = Runtime(Settings())
    admin = Admin()
    rt._admin = admin  # type: ignore[assignment]
    assert await rt.topic_exists("ingest.sms.p1") is True
    assert await rt.topic_exists("ingest.sms.p1") is True
    assert await rt.topic_exists("gone") is False
    assert admin.calls == 1
    admin.topics.add("new")
    assert await rt.topic_exists("new") is False
    loop.now += runtime_module.TOPICS_RECHECK_S
    assert await rt.topic_exists("new") is True and admin.calls == 2
    admin.down = True
    loop.now += runtime_module.TOPICS_TTL_S
    assert await rt.topic_exists("new") is None
