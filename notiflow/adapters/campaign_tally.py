"""A campaign's delivery funnel in Redis: one bitmap per (campaign, outcome), bit ``n`` set
when the message of manifest row ``n`` reached the outcome.

Setting a bit is idempotent, so replayed or duplicated status events never count twice, and
``BITCOUNT`` gives exact counts at any size (a 50-million-row campaign: 6.25 MB per
outcome). The reconciler marks the outcomes it applies (``flows/receipts/reconcile.py``); the API
reads the counts. Cassandra stays the source of truth of each message's status: the funnel is
a view, and an outcome applied while Redis was unreachable is missing from it (logged).

Keys ``{prefix}campaign-tally:{campaign_id}:{outcome}``, kept ``operational_ttl`` after the
last mark.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import redis.asyncio as aioredis

from notiflow.correlation import CorrelationKeys
from notiflow.schemas.campaigns import parse_row_message_id
from notiflow.schemas.enums import Status

OUTCOMES: dict[Status, str] = {
    Status.PROVIDER_ACCEPTED: "provider_accepted",
    Status.DELIVERED: "delivered",
    Status.FAILED: "failed",
    Status.BOUNCED: "failed",
    Status.SUPPRESSED: "suppressed",
    Status.EXPIRED: "expired",
    Status.CANCELLED: "cancelled",
}
"""Status → the funnel count it adds to (``CampaignCounts``)."""
NAMES = tuple(sorted(set(OUTCOMES.values())))


class CampaignTally:
    """Marks and counts of campaign outcomes."""

    def __init__(self, client: aioredis.Redis, prefix: str, keep: timedelta) -> None:
        self.r = client
        self.prefix = prefix
        self.keep_ms = int(keep.total_seconds() * 1000)

    def key(self, campaign_id: str, outcome: str) -> str:
        return f"{self.prefix}campaign-tally:{campaign_id}:{outcome}"

    @staticmethod
    def marks(pairs: Iterable[tuple[str, Status]], keys: CorrelationKeys
              ) -> list[tuple[str, int, str]]:
        """(campaign, row, outcome) of the pairs (message id, status) that count: those of
        campaign row ids whose tag ``keys`` made."""
        out = []
        for message_id, status in pairs:
            outcome = OUTCOMES.get(status)
            found = parse_row_message_id(keys, message_id) if outcome else None
            if found is not None and outcome is not None:
                out.append((found[0], found[1], outcome))
        return out

    async def mark(self, pairs: Iterable[tuple[str, Status]], keys: CorrelationKeys) -> int:
        """Set the bits of the pairs that count, in one round trip; how many."""
        marks = self.marks(pairs, keys)
        if not marks:
            return 0
        pipe = self.r.pipeline(transaction=False)
        touched = set()
        for campaign_id, row, outcome in marks:
            key = self.key(campaign_id, outcome)
            touched.add(key)
            pipe.setbit(key, row, 1)
        for key in touched:
            pipe.pexpire(key, self.keep_ms)
        await pipe.execute()
        return len(marks)

    async def counts(self, campaign_id: str) -> dict[str, int]:
        """Messages of the campaign that reached each outcome."""
        pipe = self.r.pipeline(transaction=False)
        for name in NAMES:
            pipe.bitcount(self.key(campaign_id, name))
        return dict(zip(NAMES, map(int, await pipe.execute()), strict=True))
