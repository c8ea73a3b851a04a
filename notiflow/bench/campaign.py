"""``notiflow bench campaign``: a campaign of ``n`` SMS (or email) recipients from a manifest
in the stack's S3 store, created through the bulk API and expanded by an expander process,
while P0 OTPs go through the priority API at ``otp_rate``/s.

An email campaign goes through SendGrid alone (the SMTP relay, P3's cheaper default route, is
left unconfigured) with the P3 send flow batching ``provider_batch`` messages per Mail Send
request (1: one request per message), so two runs compare the send flow's CPU per message
and the requests SendGrid receives with and without bulk batching.

Reported: the expansion (rows/s from the first expanded row to the last, expander CPU per
row, expander RSS over the run), the P3 drain (provider-accepted messages of the campaign per
second), and P0's latency (API ``accepted_at`` → the emulator's receipt of the first accepted
request) during the campaign, with its share within the 1 s SLA. Provider rates are raised
(``PROVIDER_RATES``) so that the P3 share of the channel capacity does not cap the expansion: the
figures are what the processes cost, not a contract's ceiling.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from notiflow.bench import calibrate
from notiflow.bench.harness import OtpStream, Phase, wait_until
from notiflow.bench.stats import summary
from notiflow.bench.warmup import warm_up
from notiflow.bench.workload import REGIONS, TEMPLATE_IDS, PhoneFactory
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import DEFAULT_TIERS

PROVIDER_RATES = {"twilio": 5000.0, "vonage": 5000.0, "sendgrid": 5000.0, "smtp": 200.0,
                  "fcm": 10_000.0, "apns": 10_000.0}
TENANT = "mkt"
MANIFEST_PHONES = 560_000
"""First serial of the manifest's numbers: after the OTPs' (500,000) and the warm-up's
(250,000); each region's serials end at 999,999, enough for ~2.5 million daytime numbers."""


def manifest(n: int, phones: PhoneFactory) -> bytes:
    """``n`` rows ``phone,first_name,code`` of unique mobile numbers in daytime regions."""
    lines = ["phone,first_name,code",
             *(f"{phones.take()},Ana{i},{i % 1_000_000:06d}" for i in range(1, n + 1))]
    return ("\n".join(lines) + "\n").encode()


def email_manifest(n: int, run_id: str) -> bytes:
    """``n`` rows ``email,first_name,code`` of unique addresses."""
    lines = ["email,first_name,code",
             *(f"reader{i}.{run_id}@example.com,Ana{i},{i % 1_000_000:06d}"
               for i in range(1, n + 1))]
    return ("\n".join(lines) + "\n").encode()


MAPPINGS = {
    Channel.SMS: {"recipient": "phone",
                  "variables": {"brand": "first_name", "headline": "first_name",
                                "code": "code"}},
    Channel.EMAIL: {"recipient": "email",
                    "variables": {"brand": "first_name", "headline": "first_name",
                                  "first_name": "first_name", "html": "code"}},
}


def channel_env(channel: Channel, provider_batch: int | None) -> dict[str, str]:
    """Email: SendGrid the only email route, and P3's ``provider_batch`` when given."""
    env: dict[str, str] = {}
    if channel is Channel.EMAIL:
        env["NOTIFLOW_SMTP__PASSWORD"] = ""
    if provider_batch is not None:
        p3 = DEFAULT_TIERS[Tier.P3].model_copy(update={"provider_batch": provider_batch})
        env["NOTIFLOW_TIERS"] = json.dumps({"P3": p3.model_dump(mode="json")})
    return env


def upload(phase: Phase, data: bytes, tenant: str = TENANT) -> str:
    """Put ``data`` under ``tenant``'s manifest prefix; its URI."""
    from notiflow.adapters.manifests import tenant_location
    from notiflow.adapters.object_store import ObjectStore

    uri = f"{tenant_location(phase.settings, tenant)}bench/{uuid.uuid4().hex}.csv"
    store, key = ObjectStore.open(uri, phase.settings.object_store)
    asyncio.run(store.put(key, data))
    return uri


def run(out: Path, *, n: int, otp_rate: float, max_rate: float, max_drain: float,
        log: Callable[[str], None], channel: Channel = Channel.SMS,
        provider_batch: int | None = None) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:6]
    phase = Phase("campaign", out, run_id,
                  extra_env={"NOTIFLOW_PROVIDER_RATES": json.dumps(PROVIDER_RATES),
                             "NOTIFLOW_CAMPAIGNS__MAX_RATE": str(max_rate),
                             **channel_env(channel, provider_batch)})
    batch = phase.settings.policy(Tier.P3).provider_batch
    phase.prepare()
    progress: list[dict[str, Any]] = []
    try:
        phase.start_platform()
        for tier in (Tier.P0, Tier.P3):
            phase.start_send(tier)
        phase.start("expander", ["flow", "expander", "--name", "bench"],
                    ready="starting expander")
        phase.sampler.start()
        versions = phase.templates(["acme", TENANT])
        phones = PhoneFactory(REGIONS, datetime.now(UTC), start=500_000)
        built = time.monotonic()
        data = (email_manifest(n, run_id) if channel is Channel.EMAIL else
                manifest(n, PhoneFactory(REGIONS, datetime.now(UTC), start=MANIFEST_PHONES)))
        uri = upload(phase, data)
        log(f"manifest: {n:,} rows, {len(data) / 1e6:.1f} MB, built and uploaded in "
            f"{time.monotonic() - built:.0f} s")
        warm = warm_up(phase, versions, phones, otp_rate, f"{run_id}c", log)
        otps = OtpStream(phase, versions, otp_rate, phones, f"otp-{run_id}-campaign")
        speed = {"before": calibrate.speed()}
        client = httpx.Client(base_url=phase.bulk_api, headers=phase.auth(TENANT), timeout=30)
        t0 = time.time()
        otps.start()
        requests_before = provider_requests(phase)
        r = client.post("/v1/campaigns", json={
            "name": "bench", "channel": channel.value, "template_id": TEMPLATE_IDS[channel],
            "template_version": versions[(TENANT, channel)], "manifest": uri,
            "mapping": MAPPINGS[channel], "max_rate": max_rate})
        r.raise_for_status()
        cid = r.json()["campaign_id"]
        log(f"campaign {cid}: {n:,} rows at up to {max_rate:,.0f}/s; OTPs at {otp_rate}/s")

        def done() -> bool:
            c = client.get(f"/v1/campaigns/{cid}").json()
            progress.append({"t": round(time.time() - t0, 1), **c["counts"],
                             "state": c["state"]})
            if len(progress) % 15 == 0:
                k = c["counts"]
                log(f"  {progress[-1]['t']:.0f} s: {c['state']}, read {k['read']:,}, "
                    f"provider-accepted {k['provider_accepted']:,}")
            return bool(c["state"] in ("completed", "failed", "cancelled")
                        and c["counts"]["provider_accepted"] >= c["counts"]["expanded"])

        drained = wait_until(done, max_drain, interval=2.0, phase=phase)
        accepted_otps, refused = otps.stop()
        sent = len(accepted_otps) + warm.otps
        wait_until(lambda: phase.accepted_count("msg_") >= sent, 60)
        t1 = time.time()
        requests = provider_requests(phase) - requests_before
        first = phase.first_accepts()
        phase.check_alive()
        speed["after"] = calibrate.speed()
    finally:
        phase.stop()
    doc = figures(progress, accepted_otps, refused, first, phase, t0, t1)
    accepted = doc["rows"].get("provider_accepted") or 0
    doc["send_p3"] = {
        "provider_batch": batch, "requests": requests if channel is Channel.EMAIL else None,
        "messages_per_request": round(accepted / requests, 1)
        if channel is Channel.EMAIL and requests else None,
        "cpu_ms_per_msg": round(phase.sampler.cpu_between("send-p3", t0, t1) * 1000
                                / max(1, accepted), 3)}
    return {"bench": "campaign", "run_id": run_id, "n": n, "channel": channel.value,
            "otp_rate": otp_rate, "max_rate": max_rate, "drained": drained,
            "wall_s": round(t1 - t0, 1), "warmup": warm.as_json(), "speed": speed, **doc}


def provider_requests(phase: Phase) -> int:
    """Mail Send requests the SendGrid emulator has received."""
    r = phase.admin.get(f"{phase.fakes}/_admin/sendgrid/stats", timeout=30)
    r.raise_for_status()
    return int(r.json().get("requests", 0))


def figures(progress: list[dict[str, Any]], accepted: dict[str, float], refused: int,
            first: dict[str, float], phase: Phase, t0: float, t1: float) -> dict[str, Any]:
    """Expansion, drain, expander cost and P0 latency of one run."""
    p0 = sorted((first[m] - t0, (first[m] - at) * 1000) for m, at in accepted.items()
                if m in first)
    lat = [x for _, x in p0]
    expanding = [p for p in progress if p["expanded"] > 0]
    start = expanding[0]["t"] if expanding else None
    end = next((p["t"] for p in progress if p["state"] == "completed"), None)
    last = progress[-1] if progress else {}
    drained_at = next((p["t"] for p in progress if p["provider_accepted"] >= last.get(
        "expanded", 1) and p["state"] == "completed"), None)
    cpu = phase.sampler.cpu_between("expander", t0, t1)
    rows = last.get("read", 0)
    procs = phase.sampler.table(t0, t1)
    return {
        "rows": {k: last.get(k) for k in ("read", "expanded", "rejected", "provider_accepted",
                                         "delivered", "failed")},
        "expansion": {"start_s": start, "end_s": end,
                      "rows_per_s": round(rows / (end - start)) if start and end else None,
                      "expander_cpu_ms_per_row": round(cpu * 1000 / max(1, rows), 3),
                      "expander_rss_mb": [round(x, 1) for x in phase.sampler.rss("expander")]},
        "drain": {"end_s": drained_at, "drained": drained_at is not None,
                  "per_s": _drain_rate(progress, start, drained_at)},
        "p0": {**{k: round(v, 1) if isinstance(v, float) else v
                  for k, v in summary(lat).items()},
               "sent": len(accepted), "refused": refused,
               "missing": len(accepted) - len(lat),
               "within_1s": round(sum(1 for x in lat if x <= 1000) / len(lat), 5)
               if lat else None},
        "timeline": {"progress": progress, "p0": [(round(t, 2), round(x, 1)) for t, x in p0]},
        "processes": procs,
    }


def _drain_rate(progress: list[dict[str, Any]], start: float | None,
                end: float | None) -> float | None:
    """Provider-accepted messages of the campaign per second, from its first expanded row to
    the drain (or, not drained, to the last sample)."""
    if start is None or not progress:
        return None
    until = end if end is not None else progress[-1]["t"]
    done = next((p for p in progress if p["t"] >= until), progress[-1])["provider_accepted"]
    return round(done / (until - start), 1) if until > start else None
