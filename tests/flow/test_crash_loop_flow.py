"""A record that keeps crashing its flow is dead-lettered on the next start."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from bytewax.testing import TestingSource

from notiflow.adapters.kafka_io import OutRecord
from notiflow.flows.sending.classify import Classify
from notiflow.schemas.enums import Status, Tier
from notiflow.settings import Settings
from tests.flow.conftest import RUNNERS, decode, kmsg, record, send_flow

pytestmark = pytest.mark.flow


class Bug(Exception):
    pass


@pytest.mark.parametrize("runner", list(RUNNERS))
def test_crash_looping_record_goes_to_the_dlq(stack: Settings, fakes: str, template: int,
                                               runner: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    original = Classify.classify

    async def buggy(self: Classify, ctx: Any, w: Any, *args: Any, **kw: Any) -> Any:
        if str(w.record.variables.get("code")).startswith("boom"):
            raise Bug("invariant broken")
        return await original(self, ctx, w, *args, **kw)

    monkeypatch.setattr(Classify, "classify", buggy)
    base = 10**12 + uuid.uuid4().int % 10**9
    items = [kmsg(stack, record(f"{base}-ok"), base), kmsg(stack, record(f"boom-{base}"), base + 1)]
    limit = stack.dlq.max_crashes
    for _ in range(limit):
        with pytest.raises(Exception, match="StatefulBatchLogic"):
            RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(list(items)), []))

    out: list[OutRecord] = []
    RUNNERS[runner](send_flow(stack, Tier.P1, TestingSource(list(items)), out))
    events, dlq, _ = decode(stack, out)
    [dead] = dlq
    assert dead.error_class == "crash_loop" and dead.category == "bug"
    assert dead.source_offset == base + 1 and f"{limit} times" in dead.reason
    assert [e.status for e in events] == [Status.PROVIDER_ACCEPTED]
