"""``notiflow top --once`` with traffic flowing through the session's flows: the tier's rate
is nonzero, p99 is measured, and the provider's circuit state is shown."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.ops.procs import ManagedProcess
from notiflow.ops.top import TopCollector
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.helpers import SUCCESS, message_row, wait_for, wait_until

pytestmark = pytest.mark.integration


NUMBERS = ["+14155552671", "+12025550143", "+447911123456", "+33612345678", "+61412345678",
           "+14155550199"]


def post_p0(api: str, token: str, version: int, n: int = 0) -> str:
    """A P0 SMS (transactional: the OTP recipient cap would suppress repeats)."""
    r = httpx.post(f"{api}/v1/messages", headers={
        "Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex},
        json={"channel": "SMS", "tier": "P0", "recipient": NUMBERS[n % len(NUMBERS)],
              "template_id": "otp", "template_version": version,
              "variables": {"code": uuid.uuid4().hex[:6]}})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def row_of(text: str, first: str) -> str:
    return next(line for line in text.splitlines() if line.strip("│┃| ").startswith(first))


def test_top_once_shows_rate_p99_and_breakers(
        stack: Settings, api: str, tokens: dict[str, str], otp_template: dict[str, int],
        send_p0: ManagedProcess, reconciler: ManagedProcess, cql: Session,
        log_dir: Path) -> None:
    ids = [post_p0(api, tokens["acme"], otp_template["acme"], n) for n in range(6)]
    for mid in ids:
        wait_for(lambda mid=mid: (message_row(cql, mid) or {}).get("status") in SUCCESS,
                 what=f"{mid} accepted by the provider")
    out = subprocess.run([sys.executable, "-m", "notiflow.cli", "top", "--once", "--window",
                          "60"], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "COLUMNS": "140"})
    (log_dir / "top-once.txt").write_text(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "\x1b[" not in text
    p0 = row_of(text, "P0")
    rate = float(re.split(r"[│┃|]", p0)[2])
    assert rate > 0, text
    assert re.search(r"\d+(\.\d+)? (ms|s) \(n=\d+\)", p0), p0
    twilio = row_of(text, "twilio")
    assert "CLOSED" in twilio or "OPEN" in twilio or "HALF_OPEN" in twilio
    assert "DLQ depth (unresolved): P0=" in text
    assert not any(n in text for n in NUMBERS)


def test_collector_frame_counts_events(stack: Settings, api: str, tokens: dict[str, str],
                                       otp_template: dict[str, int], send_p0: ManagedProcess,
                                       cql: Session) -> None:
    async def run() -> None:
        collector = TopCollector(stack, window_s=60, dlq_every_s=3600)
        await collector.open()
        try:
            await collector.catch_up()
            before = collector.window.seen
            mid = post_p0(api, tokens["acme"], otp_template["acme"])
            await asyncio.to_thread(
                wait_for, lambda: (message_row(cql, mid) or {}).get("status") in SUCCESS)

            async def grown() -> bool:
                await collector.poll()
                return collector.window.seen > before

            await wait_until(grown, timeout=20, interval=0.2, what="the collector's window")
            frame = await collector.frame()
            assert frame.tier(Tier.P0).done_per_s > 0
            assert frame.tier(Tier.P0).latency_samples >= 1
            assert frame.tier(Tier.P0).reporters >= 1
            assert any(b.provider == "twilio" for b in frame.breakers)
        finally:
            await collector.close()

    asyncio.run(run())
