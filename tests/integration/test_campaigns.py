"""Campaigns end to end on the real stack and the real S3-compatible server: manifests put into
SeaweedFS, ``POST /v1/campaigns`` through the API, expander processes (one SIGKILLed), the P3
send flow and the reconciler, the emulators counting what reached them."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from notiflow.adapters.manifests import tenant_location
from notiflow.adapters.object_store import ObjectStore
from notiflow.correlation import CorrelationKeys
from notiflow.ops.procs import ManagedProcess, ProcessGroup
from notiflow.schemas.campaigns import parse_row_message_id
from notiflow.settings import Settings
from tests.helpers import hold, wait_for

pytestmark = pytest.mark.integration

SETTLE_POLL_S = 0.5
PAUSED_QUIET_S = 3.0
"""How long a paused campaign must expand nothing more."""

TEMPLATE = "Hi {{ name }}, our winter sale starts now. Reply STOP to opt out."
FINAL = {"completed", "cancelled", "failed"}


def manifest(n: int, bad_every: int = 0, offset: int = 0) -> bytes:
    """``n`` SMS rows (unique numbers from ``offset``); every ``bad_every``-th row has a
    number that is not one."""
    lines = ["phone,first_name"]
    for i in range(1, n + 1):
        phone = ("+1415-nope" if bad_every and i % bad_every == 0
                 else f"+1415{2_000_000 + offset + i}")
        lines.append(f"{phone},Ana {i}")
    return ("\n".join(lines) + "\n").encode()


def put(settings: Settings, data: bytes, tenant: str = "mkt") -> str:
    uri = f"{tenant_location(settings, tenant)}tests/{uuid.uuid4().hex}.csv"
    store, key = ObjectStore.open(uri, settings.object_store)
    asyncio.run(store.put(key, data))
    return uri


@pytest.fixture(scope="module")
def expanders(stack: Settings, log_dir: Path) -> Iterator[dict[str, ManagedProcess]]:
    group = ProcessGroup()
    procs = {n: group.add(ManagedProcess(f"expander-{n}", ["flow", "expander", "--name", n],
                                         log_dir)).start() for n in ("a", "b", "c")}
    try:
        for p in procs.values():
            p.wait_until(lambda p=p: "starting expander" in p.log_path.read_text(),
                         timeout=60)
        yield procs
    finally:
        group.stop_all()


@pytest.fixture(scope="module")
def mkt(api: str, tokens: dict[str, str]) -> httpx.Client:
    client = httpx.Client(base_url=api, timeout=30,
                          headers={"Authorization": f"Bearer {tokens['mkt']}"})
    r = client.post("/v1/templates", json={"template_id": "winter", "channel": "SMS",
                                           "body": TEMPLATE})
    assert r.status_code in (200, 201), r.text
    return client


def create(client: httpx.Client, uri: str, **over: Any) -> dict[str, Any]:
    body = {"name": "winter sale", "channel": "SMS", "template_id": "winter",
            "template_version": 1, "manifest": uri,
            "mapping": {"recipient": "phone", "variables": {"name": "first_name"}},
            "max_rate": 2000, **over}
    r = client.post("/v1/campaigns", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def campaign_when(client: httpx.Client, cid: str, done: Any, timeout: float = 240.0
                  ) -> dict[str, Any]:
    """The campaign's view once ``done`` holds for it."""
    def view() -> dict[str, Any] | None:
        c = dict(client.get(f"/v1/campaigns/{cid}").json())
        return c if done(c) else None

    return wait_for(view, timeout=timeout, interval=0.5, what=f"campaign {cid}")


def settle(client: httpx.Client, cid: str, quiet: float = 3.0, timeout: float = 60.0) -> int:
    """The campaign's expanded count once it stopped changing for ``quiet`` seconds (a
    batch in flight when the campaign was paused still lands and is counted)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now = int(client.get(f"/v1/campaigns/{cid}").json()["counts"]["expanded"])
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
        hold(SETTLE_POLL_S)
    raise AssertionError(f"campaign {cid} kept expanding after it was paused")


def sent_rows(settings: Settings, fakes: str, cid: str) -> collections.Counter[int]:
    """How many times each row of the campaign reached an SMS emulator."""
    keys = CorrelationKeys.from_settings(settings)
    seen: collections.Counter[int] = collections.Counter()
    for name in ("twilio", "vonage"):
        records = httpx.get(f"{fakes}/_admin/{name}/messages",
                            params={"fields": "message_id"}, timeout=60).json()
        for rec in records.get("messages", records) if isinstance(records, dict) else records:
            found = parse_row_message_id(keys, rec.get("message_id") or "")
            if found and found[0] == cid:
                seen[found[1]] += 1
    return seen


def test_five_thousand_rows_with_two_percent_bad(
        stack: Settings, mkt: httpx.Client, fakes: str, send_p3: ManagedProcess,
        expanders: dict[str, ManagedProcess]) -> None:
    uri = put(stack, manifest(5_000, bad_every=50))
    cid = create(mkt, uri)["campaign_id"]
    c = campaign_when(mkt, cid, lambda c: c["counts"]["provider_accepted"] >= 4_900
                      and c["state"] in FINAL, timeout=420)
    assert c["state"] == "completed"
    k = c["counts"]
    assert (k["read"], k["expanded"], k["rejected"], k["provider_accepted"]) == (
        5_000, 4_900, 100, 4_900)
    assert c["remaining"] == 0
    errors, after = [], 0
    while True:
        page = mkt.get(f"/v1/campaigns/{cid}/errors", params={"after": after}).json()
        errors += page["errors"]
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert [e["row"] for e in errors] == list(range(50, 5_001, 50))
    assert all("phone" in e["reason"] or "recipient" in e["reason"] for e in errors)
    seen = sent_rows(stack, fakes, cid)
    assert len(seen) == 4_900 and max(seen.values()) == 1


def test_expander_killed_mid_campaign_loses_and_repeats_nothing(
        stack: Settings, mkt: httpx.Client, fakes: str, send_p3: ManagedProcess,
        expanders: dict[str, ManagedProcess]) -> None:
    uri = put(stack, manifest(3_000, offset=100_000))
    cid = create(mkt, uri, max_rate=300)["campaign_id"]
    campaign_when(mkt, cid, lambda c: c["counts"]["expanded"] >= 600, timeout=60)
    holder = next(n for n, p in expanders.items()
                  if p.alive and f"took campaign {cid}" in p.log_path.read_text())
    expanders[holder].kill()
    c = campaign_when(mkt, cid, lambda c: c["state"] in FINAL
                      and c["counts"]["provider_accepted"] >= 3_000, timeout=240)
    assert c["state"] == "completed" and c["counts"]["expanded"] == 3_000
    seen = sent_rows(stack, fakes, cid)
    assert sorted(seen) == list(range(1, 3_001)) and max(seen.values()) == 1


def test_pause_resume_and_cancel(stack: Settings, mkt: httpx.Client, fakes: str,
                                 send_p3: ManagedProcess,
                                 expanders: dict[str, ManagedProcess]) -> None:
    uri = put(stack, manifest(4_000, offset=200_000))
    cid = create(mkt, uri, max_rate=200)["campaign_id"]
    campaign_when(mkt, cid, lambda c: c["counts"]["expanded"] >= 400, timeout=60)
    assert mkt.post(f"/v1/campaigns/{cid}/pause").json()["state"] == "paused"
    held = settle(mkt, cid)
    hold(PAUSED_QUIET_S)
    assert mkt.get(f"/v1/campaigns/{cid}").json()["counts"]["expanded"] == held < 4_000
    assert mkt.post(f"/v1/campaigns/{cid}/pause").status_code == 200
    assert mkt.post(f"/v1/campaigns/{cid}/resume").json()["state"] == "running"
    campaign_when(mkt, cid, lambda c: c["counts"]["expanded"] >= held + 400, timeout=60)
    c = mkt.post(f"/v1/campaigns/{cid}/cancel").json()
    assert c["state"] == "cancelled"
    assert mkt.post(f"/v1/campaigns/{cid}/resume").status_code == 409
    settled: list[dict[str, int]] = []

    def stopped(c: dict[str, Any]) -> bool:
        k = c["counts"]
        settled.append(k)
        return (len(settled) > 6 and settled[-7]["expanded"] == k["expanded"]
                and k["provider_accepted"] + k["cancelled"] == k["expanded"])

    after = campaign_when(mkt, cid, stopped, timeout=120)["counts"]
    assert after["expanded"] < 4_000 and after["cancelled"] > 0
    seen = sent_rows(stack, fakes, cid)
    assert len(seen) == after["provider_accepted"] and max(seen.values()) == 1


def test_admission_refuses_what_the_tenant_may_not_run(
        stack: Settings, api: str, tokens: dict[str, str], mkt: httpx.Client) -> None:
    promo = httpx.Client(base_url=api, timeout=30,
                         headers={"Authorization": f"Bearer {tokens['promo']}"})
    r = promo.post("/v1/templates", json={"template_id": "winter", "channel": "SMS",
                                          "body": TEMPLATE})
    assert r.status_code in (200, 201), r.text
    uri = put(stack, manifest(10), "promo")
    own = put(stack, manifest(10))
    later = "2030-01-01T10:00:00Z"
    body = {"starts_at": later, "ends_at": "2030-01-02T10:00:00Z"}
    first = [create(promo, uri, **body)["campaign_id"] for _ in range(2)]
    r = promo.post("/v1/campaigns", json={
        "name": "third", "channel": "SMS", "template_id": "winter", "template_version": 1,
        "manifest": uri, "mapping": {"recipient": "phone", "variables": {"name": "first_name"}},
        **body})
    assert r.status_code == 429 and r.json()["reason"] == "campaign_quota"
    assert int(r.headers["retry-after"]) >= 1
    too_big = promo.post("/v1/campaigns", json={
        "name": "big", "channel": "SMS", "template_id": "winter", "template_version": 1,
        "manifest": uri, "quota": 1_000_000, **body,
        "mapping": {"recipient": "phone", "variables": {"name": "first_name"}}})
    assert too_big.status_code == 422 and too_big.json()["reason"] == "quota_too_large"
    for cid in first:
        assert promo.post(f"/v1/campaigns/{cid}/cancel").json()["state"] == "cancelled"
    assert create(promo, uri, **body)["state"] == "scheduled"
    missing = mkt.post("/v1/campaigns", json={
        "name": "x", "channel": "SMS", "template_id": "winter", "template_version": 1,
        "manifest": f"{tenant_location(stack, 'mkt')}nope.csv",
        "mapping": {"recipient": "phone", "variables": {"name": "first_name"}}})
    assert missing.status_code == 422 and missing.json()["reason"] == "manifest_unreadable"
    for foreign in (uri, f"{tenant_location(stack, 'promo')}nope.csv"):
        theirs = mkt.post("/v1/campaigns", json={
            "name": "x", "channel": "SMS", "template_id": "winter", "template_version": 1,
            "manifest": foreign,
            "mapping": {"recipient": "phone", "variables": {"name": "first_name"}}})
        assert theirs.status_code == 422 and theirs.json()["reason"] == "manifest_not_allowed"
    unmapped = mkt.post("/v1/campaigns", json={
        "name": "x", "channel": "SMS", "template_id": "winter", "template_version": 1,
        "manifest": own, "mapping": {"recipient": "phone"}})
    assert unmapped.status_code == 422
    assert unmapped.json()["reason"] == "missing_template_variable"
    p0 = mkt.post("/v1/campaigns", json={
        "name": "x", "channel": "SMS", "tier": "P0", "template_id": "winter",
        "template_version": 1, "manifest": own,
        "mapping": {"recipient": "phone", "variables": {"name": "first_name"}}})
    assert p0.status_code == 422


def test_cli_uploads_creates_follows_and_summarises(
        stack: Settings, api: str, tokens: dict[str, str], mkt: httpx.Client,
        send_p3: ManagedProcess, expanders: dict[str, ManagedProcess], tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    path = tmp_path / "small.csv"
    path.write_bytes(manifest(50, bad_every=25, offset=300_000))
    uri = f"{tenant_location(stack, 'mkt')}tests/{uuid.uuid4().hex}.csv"
    env = {**os.environ, "NOTIFLOW_TOKEN": tokens["mkt"], "COLUMNS": "250"}
    cli = [sys.executable, "-m", "notiflow.cli", "campaigns"]
    foreign = subprocess.run([*cli, "upload", str(path), "--tenant", "promo", "--to", uri],
                             env=env, capture_output=True, text=True, timeout=60)
    assert foreign.returncode == 2, foreign.stdout
    up = subprocess.run([*cli, "upload", str(path), "--tenant", "mkt", "--to", uri], env=env,
                        capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    made = subprocess.run([*cli, "create", "--name", "cli sale", "--manifest", uri,
                           "--template", "winter", "--version", "1", "--channel", "SMS",
                           "--recipient", "phone", "--var", "name=first_name", "--api", api],
                          env=env, capture_output=True, text=True, timeout=180)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "completed" in made.stdout and "rejected" in made.stdout
    cid = made.stdout.split("campaign ", 1)[1].split()[0]
    shown = subprocess.run([*cli, "show", cid, "--errors", "5", "--api", api], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "25" in shown.stdout and "50" in shown.stdout
    listed = subprocess.run([*cli, "list", "--api", api], env=env, capture_output=True,
                            text=True, timeout=60)
    assert cid[:20] in listed.stdout
    refused = subprocess.run([*cli, "pause", cid, "--api", api], env=env,
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "409" in refused.stdout


def test_state_changes_reach_the_campaign_webhook_signed(
        stack: Settings, mkt: httpx.Client, send_p3: ManagedProcess,
        expanders: dict[str, ManagedProcess]) -> None:
    """scheduled → running → paused → running → completed (in ``occurred_at`` order: several
    expanders deliver notices concurrently; the resume waits for the pause's notice, as a
    pause and a resume a millisecond apart may carry the same time), each POSTed once to
    the campaign's webhook,
    signed with the tenant's secrets: the ``standardwebhooks`` library (a third party)
    verifies every one."""
    from standardwebhooks.webhooks import Webhook

    from notiflow.bench.webhook_receiver import Receiver

    tenant = stack.tenant("mkt")
    assert tenant is not None and tenant.webhook_secrets
    secret = tenant.webhook_secrets[0].get_secret_value()
    with Receiver([secret]) as rx:
        uri = put(stack, manifest(2_000, offset=400_000))
        cid = create(mkt, uri, max_rate=200, webhook=rx.url())["campaign_id"]
        campaign_when(mkt, cid, lambda c: c["counts"]["expanded"] >= 500, timeout=60)
        assert mkt.post(f"/v1/campaigns/{cid}/pause").json()["state"] == "paused"
        wait_for(lambda: "paused" in {h.body["data"]["state"] for h in rx.delivered()},
                 timeout=30, interval=0.1, what="the pause announced before the resume")
        assert mkt.post(f"/v1/campaigns/{cid}/resume").json()["state"] == "running"
        campaign_when(mkt, cid, lambda c: c["state"] == "completed", timeout=120)
        wait_for(lambda: len(rx.delivered()) >= 5, timeout=30, interval=0.5,
                 what="five campaign webhooks")
        hits = rx.delivered()
    states = [h.body["data"]["state"]
              for h in sorted(hits, key=lambda h: h.body["data"]["occurred_at"])]
    assert states == ["scheduled", "running", "paused", "running", "completed"], states
    assert len({h.webhook_id for h in hits}) == 5
    for h in hits:
        assert h.valid and h.body["type"] == "campaign.state"
        assert h.body["data"]["campaign_id"] == cid
        Webhook(secret).verify(h.raw, dict(h.headers))
    assert hits[-1].body["data"]["counts"]["expanded"] == 2_000
