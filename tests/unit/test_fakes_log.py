"""The emulators' message log: the per-prefix count of accepted message ids that benchmarks
poll stays equal to a full scan while records arrive and the oldest are evicted; a record's
JSON is every field of it."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from notiflow.fakes.common import ACCEPTED, MessageLog, MessageRecord
from notiflow.providers.sendgrid.emulator import SendGridRecord


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


def test_a_records_json_is_its_fields_with_from_as_from() -> None:
    @dataclass(slots=True)
    class Titled(MessageRecord):
        title: str | None = None

    doc = Titled(received_at=1.0, outcome=ACCEPTED, status=202, error_code=None, sid="s",
                 message_id="m", attempt=2, to="t", from_="f", body="b", title="x").as_json()
    assert doc == {"received_at": 1.0, "outcome": ACCEPTED, "status": 202, "error_code": None,
                   "sid": "s", "message_id": "m", "attempt": 2, "to": "t", "from": "f",
                   "body": "b", "hang": False, "title": "x"}
    assert list(doc)[-3:] == ["body", "hang", "title"]
    assert list(record("m", True).as_json())[-2:] == ["body", "hang"]
    sendgrid = SendGridRecord(received_at=1.0, outcome=ACCEPTED, status=202, error_code=None,
                              sid="s", message_id="m", attempt=2, to="t", from_="f", body="b",
                              subject="hi")
    assert list(sendgrid.as_json())[-4:] == ["body", "hang", "subject", "error"]
