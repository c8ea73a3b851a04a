"""A topic send end to end on the real stack: users imported and subscribed through the API,
``POST /v1/topics/{topic}/messages``, an expander snapshotting the subscribers to the
S3-compatible server and resolving each user, the P3 send flow, and the SMS emulators
counting what reached them: every subscriber once, no duplicates.

The test command sends to 2,000 users (its time budget); ``NOTIFLOW_TOPIC_FANOUT_USERS=10000``
runs the same test with 10,000 (``docs/users.md`` gives the figures of that run)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.settings import Settings
from tests.integration.test_campaigns import FINAL, campaign_when, sent_rows

pytestmark = pytest.mark.integration

USERS = int(os.environ.get("NOTIFLOW_TOPIC_FANOUT_USERS", "2000"))
PAGE = 1_000


@pytest.fixture(scope="module")
def expander(stack: Settings, log_dir: Path) -> Iterator[ManagedProcess]:
    group = ProcessGroup()
    proc = group.add(ManagedProcess("expander-topics", ["flow", "expander", "--name", "t"],
                                    log_dir)).start()
    try:
        proc.wait_until(lambda: "starting expander" in proc.log_path.read_text(), timeout=60)
        yield proc
    finally:
        group.stop_all()


def test_every_user_of_a_topic_gets_one_message(
        stack: Settings, api: str, tokens: dict[str, str], fakes: str,
        send_p3: ManagedProcess, expander: ManagedProcess) -> None:
    mkt = httpx.Client(base_url=api, timeout=60,
                       headers={"Authorization": f"Bearer {tokens['mkt']}"})
    run = uuid.uuid4().hex[:8]
    r = mkt.post("/v1/templates", json={"template_id": f"release-{run}", "channel": "SMS",
                                        "body": "Version {{ version }} is out. Reply STOP "
                                                "to opt out."})
    assert r.status_code == 201, r.text
    ids = [f"fan-{run}-{i:05d}" for i in range(USERS)]
    topic = f"releases-{run}"
    for at in range(0, USERS, PAGE):
        page = ids[at:at + PAGE]
        r = mkt.post("/v1/users:batch", json={"users": [
            {"user_id": u, "phones": [f"+1646{5_000_000 + at + i}"], "in_app": False}
            for i, u in enumerate(page)]})
        assert r.status_code == 200 and {x["status"] for x in r.json()["results"]} == {201}
        r = mkt.put(f"/v1/topics/{topic}/subscribers", json={"users": page})
        assert r.json() == {"subscribed": len(page), "unknown": []}, r.text
    r = mkt.post(f"/v1/topics/{topic}/messages", json={
        "channels": [{"channel": "SMS", "template_id": f"release-{run}",
                      "template_version": 1}],
        "variables": {"version": "2.4"}, "max_rate": 2000})
    assert r.status_code == 201, r.text
    assert r.json()["topic"] == topic and r.json()["state"] == "scheduled"
    cid = r.json()["campaign_id"]
    c = campaign_when(mkt, cid, lambda c: c["state"] in FINAL
                      and c["counts"]["provider_accepted"] >= USERS, timeout=420)
    assert c["state"] == "completed", c
    k = c["counts"]
    assert (k["read"], k["expanded"], k["rejected"], k["provider_accepted"]) == (
        USERS, USERS, 0, USERS)
    seen = sent_rows(stack, fakes, cid)
    assert sorted(seen) == list(range(1, USERS + 1)) and max(seen.values()) == 1
