"""Which status events count in a campaign's funnel, and for which row."""

from __future__ import annotations

from notiflow.adapters.campaign_tally import NAMES, CampaignTally
from notiflow.correlation import CorrelationKeys
from notiflow.schemas.campaigns import CampaignCounts, parse_row_message_id, row_message_id
from notiflow.schemas.enums import Status

CID = "cmp_" + "0f" * 16
KEYS = CorrelationKeys((b"t" * 32,))


def test_only_campaign_messages_and_funnel_statuses_count() -> None:
    pairs = [(row_message_id(KEYS, CID, 7), Status.PROVIDER_ACCEPTED),
             (row_message_id(KEYS, CID, 7), Status.DELIVERED),
             (row_message_id(KEYS, CID, 8), Status.QUEUED),
             (row_message_id(KEYS, CID, 9), Status.BOUNCED),
             ("msg_" + "0" * 32, Status.DELIVERED),
             (f"{CID}_0", Status.DELIVERED)]
    assert CampaignTally.marks(pairs, KEYS) == [
        (CID, 7, "provider_accepted"), (CID, 7, "delivered"), (CID, 9, "failed")]


def test_every_outcome_is_a_count_of_the_view() -> None:
    assert set(NAMES) <= set(CampaignCounts.model_fields)
    assert parse_row_message_id(KEYS, row_message_id(KEYS, CID, 123_456_789)) == (
        CID, 123_456_789)
    assert parse_row_message_id(KEYS, "cmp_x_1") is None
