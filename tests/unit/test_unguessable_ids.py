"""Campaign row and schedule occurrence message ids carry a keyed tag: nobody without the
correlation keys can name them, and one merely shaped like a campaign's is not the campaign's
(not counted in its funnel, not stopped by its cancel, not archived as its)."""

from __future__ import annotations

import itertools
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notiflow import archive
from notiflow.adapters.campaign_tally import CampaignTally
from notiflow.adapters.cancel_gate import campaign_gate_key
from notiflow.correlation import TAG_LENGTH, CorrelationKeys
from notiflow.schemas.campaigns import new_campaign_id, parse_row_message_id, row_message_id
from notiflow.schemas.enums import Status
from notiflow.schemas.schedules import occurrence_message_id, occurrence_message_ids

KEYS = CorrelationKeys((b"u" * 32,))
OTHER = CorrelationKeys((b"v" * 32,))
VICTIM = "cmp_" + "5e" * 16
MESSAGE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""The message id pattern of the wire contracts (`MessageId`)."""
AT = datetime(2027, 3, 14, 7, 30, tzinfo=UTC)


def forged(cid: str, row: int) -> list[str]:
    """What a tenant who knows ``cid`` can write without the keys."""
    return [f"{cid}_{row}", f"{cid}_{row}_{'a' * TAG_LENGTH}",
            f"{cid}_{row}_{row_message_id(OTHER, cid, row).rsplit('_', 1)[1]}",
            row_message_id(KEYS, cid, row + 1).replace(f"_{row + 1}_", f"_{row}_")]


def test_a_row_id_names_its_campaign_and_row_under_the_keys() -> None:
    mid = row_message_id(KEYS, VICTIM, 7)
    assert mid.startswith(f"{VICTIM}_7_") and parse_row_message_id(KEYS, mid) == (VICTIM, 7)
    assert row_message_id(KEYS, VICTIM, 7) == mid  # a replayed row is the same message
    assert parse_row_message_id(OTHER, mid) is None


@pytest.mark.parametrize("row", [1, 2, 99, 999_999_999_999])
def test_ids_a_tenant_can_write_are_no_campaign_row(row: int) -> None:
    """The old form ``cmp_<cid>_<row>``, a made-up tag, another key's tag, another row's
    tag: none is attributed to the campaign."""
    for mid in forged(VICTIM, row):
        assert parse_row_message_id(KEYS, mid) is None, mid
        assert campaign_gate_key("ns:", mid, KEYS) is None, mid
    pairs = [(mid, Status.DELIVERED) for mid in forged(VICTIM, row)]
    assert CampaignTally.marks(pairs, KEYS) == []
    assert CampaignTally.marks([(row_message_id(KEYS, VICTIM, row), Status.DELIVERED)],
                               KEYS) == [(VICTIM, row, "delivered")]


def test_a_tag_is_canonical_lower_case() -> None:
    mid = row_message_id(KEYS, VICTIM, 3)
    cid_row, tag = mid.rsplit("_", 1)
    assert parse_row_message_id(KEYS, f"{cid_row}_{tag.upper()}") is None


def test_consecutive_rows_share_nothing_beyond_campaign_and_row() -> None:
    cid = new_campaign_id()
    tags = [row_message_id(KEYS, cid, n).removeprefix(f"{cid}_{n}_") for n in range(1, 501)]
    assert len(set(tags)) == len(tags)
    assert all(re.fullmatch(rf"[a-z2-7]{{{TAG_LENGTH}}}", t) for t in tags)
    # no position of the tag is constant across rows, nor equal between neighbours
    for i in range(TAG_LENGTH):
        assert len({t[i] for t in tags}) > 8
    assert sum(a[:3] == b[:3] for a, b in itertools.pairwise(tags)) < 5


def test_the_longest_row_id_is_a_valid_message_id() -> None:
    mid = row_message_id(KEYS, new_campaign_id(), 999_999_999_999)
    assert len(mid) <= 64 and MESSAGE_ID.fullmatch(mid)


def test_row_ids_made_before_a_rotation_still_count() -> None:
    rotated = CorrelationKeys((b"n" * 32, *KEYS.keys))
    old, new = row_message_id(KEYS, VICTIM, 4), row_message_id(rotated, VICTIM, 4)
    assert old != new
    assert parse_row_message_id(rotated, old) == parse_row_message_id(rotated, new) == (
        VICTIM, 4)


def test_the_archive_names_the_campaign_only_of_tagged_ids() -> None:
    day = datetime(2026, 12, 1, tzinfo=UTC)
    real, fake = row_message_id(KEYS, VICTIM, 1), f"{VICTIM}_2"
    rows = archive.DayRows(day.date(), "mkt", [
        {"tenant_id": "mkt", "message_id": mid, "channel": "EMAIL", "status": "DELIVERED",
         "created_at": day, "expires_at": day + timedelta(days=30)} for mid in (real, fake)],
        {}, {})
    by_id = {m["message_id"]: m["campaign_id"] for m in archive.records(rows, KEYS)["messages"]}
    assert by_id == {real: VICTIM, fake: None}


def test_occurrence_ids_are_keyed_deterministic_and_valid() -> None:
    sid = f"sch_{uuid.uuid4().hex}"
    mid = occurrence_message_id(KEYS, sid, AT)
    assert mid == occurrence_message_id(KEYS, sid, AT)  # two schedulers make one message
    assert MESSAGE_ID.fullmatch(mid) and mid.startswith("msg_") and len(mid) == 36
    # not the public derivation from (schedule, instant) anyone could compute
    public = uuid.uuid5(uuid.UUID("5b7c3e0e-6f0b-4c55-9a63-0c6a1f0d2f61"),
                        f"schedule:{sid}:{int(AT.timestamp() * 1000)}").hex
    assert mid != f"msg_{public}"
    assert occurrence_message_id(OTHER, sid, AT) != mid
    assert occurrence_message_id(KEYS, sid, AT + timedelta(minutes=1)) != mid
    assert occurrence_message_id(KEYS, f"sch_{uuid.uuid4().hex}", AT) != mid


def test_occurrences_made_before_a_rotation_are_found_after_it() -> None:
    sid = f"sch_{uuid.uuid4().hex}"
    rotated = CorrelationKeys((b"n" * 32, *KEYS.keys))
    ids = occurrence_message_ids(rotated, sid, AT)
    assert ids == (occurrence_message_id(rotated, sid, AT), occurrence_message_id(KEYS, sid, AT))


def test_the_owner_looks_a_rows_message_id_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row ids cannot be composed, so the campaign's owner asks for one (other tenants get
    the campaign's 404 from the ownership check)."""
    from fastapi.testclient import TestClient

    from notiflow.devenv import dev_environment
    from notiflow.gateway import campaigns
    from notiflow.gateway.app import build_app
    from notiflow.gateway.errors import not_found
    from notiflow.settings import Settings

    env, tokens = dev_environment(api_port=1, fakes_port=2)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings = Settings()

    async def own(rt: object, tenant_id: str, campaign_id: str) -> object:
        if (tenant_id, campaign_id) != ("mkt", VICTIM):
            raise not_found()
        return object()

    monkeypatch.setattr(campaigns, "_own", own)
    client = TestClient(build_app(settings), raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {tokens['mkt']}"}
    r = client.get(f"/v1/campaigns/{VICTIM}/rows/7", headers=auth)
    assert r.status_code == 200, r.text
    mid = r.json()["message_id"]
    assert r.json()["row"] == 7
    assert parse_row_message_id(CorrelationKeys.from_settings(settings), mid) == (VICTIM, 7)
    assert client.get(f"/v1/campaigns/{VICTIM}/rows/0", headers=auth).status_code == 422
    other = {"Authorization": f"Bearer {tokens['acme']}"}
    assert client.get(f"/v1/campaigns/{VICTIM}/rows/7", headers=other).status_code == 404
