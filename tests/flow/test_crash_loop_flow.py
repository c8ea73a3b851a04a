"""A record that keeps crashing its flow is dead-lettered on the next start (memory ports,
whose crash counts outlive each run as Redis's do)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from bytewax.testing import TestingSource

from notiflow.flows.send.stages.classifying import Classify
from notiflow.schemas.enums import Status
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, MemorySend, kmsg, record

pytestmark = pytest.mark.flow


class Bug(Exception):
    pass


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_crash_looping_record_goes_to_the_dlq(settings: Settings,
                                               memory_send: Callable[..., MemorySend],
                                               runner: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    original = Classify.classify

    async def buggy(self: Classify, ctx: Any, w: Any, *args: Any, **kw: Any) -> Any:
        if str(w.record.variables.get("code")).startswith("boom"):
            raise Bug("invariant broken")
        return await original(self, ctx, w, *args, **kw)

    monkeypatch.setattr(Classify, "classify", buggy)
    mem = memory_send()
    base = 10**12 + uuid.uuid4().int % 10**9
    items = [kmsg(settings, record(f"{base}-ok"), base),
             kmsg(settings, record(f"boom-{base}"), base + 1)]
    limit = settings.dlq.max_crashes
    for _ in range(limit):
        with pytest.raises(Exception, match="StatefulBatchLogic"):
            RUNNERS[runner](mem.flow(TestingSource(list(items)), []))

    events, dlq, _ = mem.run(runner, list(items))
    [dead] = dlq
    assert dead.error_class == "crash_loop" and dead.category == "bug"
    assert dead.source_offset == base + 1 and f"{limit} times" in dead.reason
    assert [e.status for e in events] == [Status.PROVIDER_ACCEPTED]
