"""The stream of ``notiflow chaos``'s campaign victims: one SMS campaign of ``count`` rows
from a manifest in the stack's object store, created through the bulk API and expanded by
the scenario's expander at ``rate`` rows/s.

Every row's message id is known in advance (``row_message_id(keys, campaign, row)``, with
the stack's correlation keys), so the run counts a row the expander never turned into a
message, or turned into a message that was never sent, as lost, like a message the API
accepted.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx

from notiflow.bench.campaign import MAPPINGS, manifest, upload
from notiflow.bench.harness import Phase, wait_until
from notiflow.bench.workload import REGIONS, TEMPLATE_IDS, TENANT_BY_TIER, PhoneFactory
from notiflow.correlation import CorrelationKeys
from notiflow.schemas.campaigns import row_message_id
from notiflow.schemas.enums import Channel, Tier

FIRST_PHONE = 700_000
"""First serial of the manifest's numbers (after the OTPs' 500,000 block)."""
ENDED = frozenset({"completed", "failed", "cancelled"})


def campaign_stream(phase: Phase, version: int, count: int, rate: float,
                    finish_within: float) -> tuple[dict[str, float], int]:
    """Run the campaign until it ends (or ``finish_within`` seconds pass); message_id of
    every row → when the row was due at ``rate`` (its "acceptance"), and the rows the
    expander rejected."""
    phones = PhoneFactory(REGIONS, datetime.now(UTC), start=FIRST_PHONE)
    tenant = TENANT_BY_TIER[Tier.P3]
    uri = upload(phase, manifest(count, phones), tenant)
    with httpx.Client(base_url=phase.bulk_api, headers=phase.auth(tenant), timeout=30) as c:
        r = c.post("/v1/campaigns", json={
            "name": "chaos", "channel": Channel.SMS.value,
            "template_id": TEMPLATE_IDS[Channel.SMS], "template_version": version,
            "manifest": uri, "mapping": MAPPINGS[Channel.SMS], "max_rate": rate})
        r.raise_for_status()
        cid = str(r.json()["campaign_id"])
        t0 = time.time()
        last: dict[str, object] = {}

        def ended() -> bool:
            last.update(c.get(f"/v1/campaigns/{cid}").json())
            return last.get("state") in ENDED

        wait_until(ended, timeout=finish_within, interval=1.0)
    counts = last.get("counts") or {}
    assert isinstance(counts, dict)
    keys = CorrelationKeys.from_settings(phase.settings)
    rows = {row_message_id(keys, cid, i): t0 + (i - 1) / rate for i in range(1, count + 1)}
    return rows, int(counts.get("rejected", 0))
