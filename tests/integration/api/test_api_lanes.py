"""The API's lanes: a priority-lane process and a bulk-lane one, each serving its tiers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.integration.api.support import (
    key,
    sms,
    start_api,
)

pytestmark = pytest.mark.integration


def test_lanes_serve_their_tiers_and_time_their_stages(
        log_dir: Path, auth: Callable[..., dict[str, str]], otp_template: str) -> None:
    """A priority-lane process takes P0/P1 and refuses P2/P3 (421), a bulk-lane one the
    reverse plus the provider webhooks; a 202 carries its stages as ``Server-Timing``."""
    priority, p_url = start_api("api-priority", log_dir, NOTIFLOW_API_LANE="priority")
    bulk, b_url = start_api("api-bulk", log_dir, NOTIFLOW_API_LANE="bulk")
    try:
        r = httpx.post(f"{p_url}/v1/messages", json=sms("P0"), headers=auth("acme", key()))
        assert r.status_code == 202, r.text
        timing = dict(part.strip().split(";dur=") for part in
                      r.headers["server-timing"].split(","))
        assert {"api.admission", "api.reserve", "api.write", "api.accept",
                "api.kafka_ack"} <= set(timing)
        assert all(float(v) >= 0 for v in timing.values())
        assert float(timing["api.accept"]) >= float(timing["api.reserve"])
        for url, tier in ((p_url, "P3"), (b_url, "P0"), (b_url, "P1")):
            r = httpx.post(f"{url}/v1/messages", json=sms(tier), headers=auth("acme", key()))
            assert (r.status_code, r.json()["reason"]) == (421, "wrong_lane"), r.text
        r = httpx.post(f"{b_url}/v1/messages", json=sms("P2"), headers=auth("acme", key()))
        assert r.status_code == 202, r.text
        assert httpx.post(f"{p_url}/webhooks/twilio", data={}).status_code == 404
        assert httpx.post(f"{b_url}/webhooks/twilio", data={}).status_code in (401, 403)
        assert httpx.get(f"{b_url}/v1/messages/{r.json()['message_id']}",
                         headers=auth("acme")).status_code == 200
    finally:
        priority.stop()
        bulk.stop()
