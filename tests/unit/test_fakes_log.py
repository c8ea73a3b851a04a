"""The emulators' message log: the per-prefix count of accepted message ids that benchmarks
poll stays equal to a full scan while records arrive and the oldest are evicted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from notiflow.fakes.common import ACCEPTED, MessageLog, MessageRecord


def record(mid: str, accepted: bool) -> MessageRecord:
    return MessageRecord(received_at=0.0, outcome=ACCEPTED if accepted else "error",
                         status=200 if accepted else 500, error_code=None, sid=None,
                         message_id=mid, attempt=1, to=None, from_=None, body=None)


def scan(log: MessageLog, prefix: str) -> int:
    return sum(1 for mid, recs in log.by_message_id.items()
               if mid.startswith(prefix) and any(r.accepted for r in recs))


@given(st.lists(st.tuples(st.sampled_from(["a1", "a2", "b1", "ab", "b2"]), st.booleans(),
                          st.booleans()), max_size=120),
       st.integers(1, 12))
def test_prefix_counts_match_a_scan(steps: list[tuple[str, bool, bool]], size: int) -> None:
    log = MessageLog(size)
    for mid, accepted, ask in steps:
        log.add(record(mid, accepted))
        if ask:
            for prefix in ("a", "b", "ab"):
                assert log.accepted_with_prefix(prefix) == scan(log, prefix)
    for prefix in ("a", "b", "ab", ""):
        assert log.accepted_with_prefix(prefix) == scan(log, prefix)
