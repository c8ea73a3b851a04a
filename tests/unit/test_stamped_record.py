"""``IngestRecord.stamped``: the API's record without a second validation equals the
validated one, field for field and byte for byte on the wire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from notiflow.schemas.messages import IngestRecord, SendRequest, new_message_id

AT = datetime(2026, 12, 4, 21, 0, 0, 123000, tzinfo=UTC)

recipients = st.sampled_from([
    ("SMS", "+14155552671"), ("SMS", "+447911123456"), ("EMAIL", "Jane.Doe@Example.COM"),
    ("PUSH", {"platform": "android", "device_token": "dGVzdA:APA91b" + "x" * 140}),
])
bodies = st.builds(
    lambda rc, tier, variables, ordering, later: {
        "channel": rc[0], "recipient": rc[1], "tier": tier,
        "template_id": "otp", "template_version": 3, "variables": variables,
        **({"ordering_key": ordering} if ordering else {}),
        **({"scheduled_at": (AT + later).isoformat()} if later and tier in ("P2", "P3")
           else {}),
    },
    recipients, st.sampled_from(["P0", "P1", "P2", "P3"]),
    st.dictionaries(st.text("abcxyz_", min_size=1, max_size=8),
                    st.one_of(st.text(max_size=20), st.integers(-10**6, 10**6), st.booleans()),
                    max_size=4),
    st.one_of(st.none(), st.text("abc-123", min_size=1, max_size=12)),
    st.one_of(st.none(), st.timedeltas(timedelta(minutes=1), timedelta(days=3))),
)


@settings(max_examples=150, deadline=None)
@given(bodies, st.one_of(st.none(), st.text("ABCdef-_:.", min_size=1, max_size=40)))
def test_stamped_equals_validated(body: dict[str, Any], key: str | None) -> None:
    req = SendRequest.model_validate(body)
    stamps = {"tenant_id": "acme", "message_id": new_message_id(), "idempotency_key": key,
              "accepted_at": AT,
              "expires_at": (req.scheduled_at or AT) + timedelta(hours=1)}
    validated = IngestRecord.model_validate({**req.model_dump(), **stamps})
    stamped = IngestRecord.stamped(req, **stamps)
    assert stamped == validated
    assert stamped.model_dump_json(exclude_none=True) == validated.model_dump_json(
        exclude_none=True)
    assert IngestRecord.model_validate_json(stamped.model_dump_json()) == validated
