"""Which status events count in a campaign's funnel, and for which row."""

from __future__ import annotations

from notiflow.adapters.campaign_tally import NAMES, CampaignTally
from notiflow.schemas.campaigns import CampaignCounts, parse_row_message_id, row_message_id
from notiflow.schemas.enums import Status

CID = "cmp_" + "0f" * 16


def test_only_campaign_messages_and_funnel_statuses_count() -> None:
    pairs = [(row_message_id(CID, 7), Status.PROVIDER_ACCEPTED),
             (row_message_id(CID, 7), Status.DELIVERED),
             (row_message_id(CID, 8), Status.QUEUED),
             (row_message_id(CID, 9), Status.BOUNCED),
             ("msg_" + "0" * 32, Status.DELIVERED),
             (f"{CID}_0", Status.DELIVERED)]
    assert CampaignTally.marks(pairs) == [(CID, 7, "provider_accepted"), (CID, 7, "delivered"),
                                          (CID, 9, "failed")]


def test_every_outcome_is_a_count_of_the_view() -> None:
    assert set(NAMES) <= set(CampaignCounts.model_fields)
    assert parse_row_message_id(row_message_id(CID, 123_456_789)) == (CID, 123_456_789)
    assert parse_row_message_id("cmp_x_1") is None
