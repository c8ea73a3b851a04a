"""Recipient preferences, device tokens and admission control against the real stack
(``notiflow api`` as a subprocess; extra API processes with their own settings)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis.asyncio as aioredis
from cassandra.cluster import Session

from notiflow.adapters.admission import AdmissionStore, Bucket
from notiflow.adapters.backlog import backlog_key, report
from notiflow.devenv import free_port
from notiflow.redact import recipient_hash
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import SendRequest
from notiflow.schemas.preferences import PreferenceState, state_key
from notiflow.settings import Settings
from tests.helpers import (
    fresh_email,
    fresh_ios_token,
    fresh_phone,
    read_topic,
    wait_for,
    wait_until,
)
from tests.integration.api.support import TEMPLATE, key, sms, start_api

pytestmark = pytest.mark.integration

LIMITED_RATE = 0.2
"""Slow enough that a request taking a while on a loaded machine does not refill the bucket."""
TWILIO_RATE = 1.0


@pytest.fixture(scope="module")
def limited_token() -> str:
    return f"nf_limited_{secrets.token_urlsafe(24)}"


@pytest.fixture(scope="module")
def auth(tokens: dict[str, str], limited_token: str) -> Callable[..., dict[str, str]]:
    def make(tenant: str, key: str | None = None) -> dict[str, str]:
        token = limited_token if tenant == "limited" else tokens[tenant]
        h = {"Authorization": f"Bearer {token}"}
        if key is not None:
            h["Idempotency-Key"] = key
        return h

    return make


def ensure_template(c: httpx.Client, headers: dict[str, str]) -> None:
    r = c.post("/v1/templates", headers=headers, json={
        "template_id": TEMPLATE, "version": 1, "channel": "SMS",
        "body": "Your code is {{ code }}"})
    assert r.status_code in (200, 201), r.text


@pytest.fixture(scope="module")
def otp_template(client: httpx.Client, auth: Callable[..., dict[str, str]]) -> str:
    for tenant in ("acme", "globex", "mkt"):
        ensure_template(client, auth(tenant))
    return TEMPLATE


@pytest.fixture(scope="module")
def tight_api(log_dir: Path, limited_token: str, stack: Settings,
              auth: Callable[..., dict[str, str]]) -> Iterator[httpx.Client]:
    """An API whose tenants include ``limited`` (:data:`LIMITED_RATE`) and whose SMS
    provider rate makes the P0 envelope 0.2 msg/s (20 % of :data:`TWILIO_RATE`)."""
    tenants = json.loads(os.environ["NOTIFLOW_TENANTS"])
    tenants.append({"id": "limited", "token": limited_token, "rate_limit": LIMITED_RATE})
    proc, base = start_api("api-tight", log_dir, NOTIFLOW_TENANTS=json.dumps(tenants),
                           NOTIFLOW_PROVIDER_RATES=json.dumps({"twilio": TWILIO_RATE}))
    try:
        with httpx.Client(base_url=base, timeout=30.0) as c:
            for tenant in ("limited", "acme"):
                ensure_template(c, auth(tenant))
            yield c
    finally:
        proc.stop()


def prefs_url(recipient: str) -> str:
    return f"/v1/recipients/{quote(recipient, safe='')}/preferences"


def device_url(recipient: str, token: str) -> str:
    return f"/v1/recipients/{quote(recipient, safe='')}/devices/{quote(token, safe='')}"


def stored_state(cql: Session, tenant: str, rhash: str) -> dict[str, Any] | None:
    row: dict[str, Any] | None = cql.execute(
        "SELECT * FROM recipient_preferences WHERE tenant_id = %s AND recipient_hash = %s",
        (tenant, rhash)).one()
    return row


def published(settings: Settings, tenant: str, rhash: str) -> list[PreferenceState]:
    """Every state of one recipient on ``notify.preferences``, in partition order."""
    wanted = state_key(tenant, rhash).encode()
    return [PreferenceState.model_validate_json(m.value())
            for m in read_topic(settings, settings.preferences_topic)
            if m.key() == wanted]


QUIET = {"start": "22:00:00", "end": "07:30:00"}
OPT_OUTS = [{"channel": "SMS", "category": "marketing"}, {"channel": "*", "category": "account"}]


# ------------------------------------------------------------------------- preferences


def test_preferences_round_trip(client: httpx.Client, auth: Callable[..., dict[str, str]],
                                cql: Session, settings: Settings) -> None:
    phone = fresh_phone()
    rhash = recipient_hash("acme", phone)
    assert client.get(prefs_url(phone), headers=auth("acme")).status_code == 404

    r = client.put(prefs_url(phone), headers=auth("acme"), json={
        "timezone": "Europe/Zurich", "quiet_hours": QUIET, "opt_outs": OPT_OUTS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["version"] == 1
    assert body["recipient_hash"] == rhash
    assert body["recipient"] != phone and body["recipient"].startswith(phone[:5])
    assert phone not in r.text
    assert (body["timezone"], body["quiet_hours"], body["opt_outs"], body["suppressed"]) == (
        "Europe/Zurich", QUIET, OPT_OUTS, None)

    row = stored_state(cql, "acme", rhash)
    assert row is not None and row["version"] == 1
    assert row["opt_outs"] == ["SMS/marketing", "*/account"]

    got = client.get(prefs_url(phone), headers=auth("acme"))
    assert got.status_code == 200
    assert got.json() == body

    second = client.put(prefs_url(phone), headers=auth("acme"), json={"timezone": "Asia/Tokyo"})
    assert second.status_code == 200, second.text
    assert second.json()["version"] == 2
    assert (second.json()["quiet_hours"], second.json()["opt_outs"]) == (None, [])
    row = stored_state(cql, "acme", rhash)
    assert row is not None and (row["version"], row["timezone"], row["opt_outs"]) == (
        2, "Asia/Tokyo", None)

    states = published(settings, "acme", rhash)
    assert [s.version for s in states] == [1, 2]
    assert states[0].opt_outs[0].channel == "SMS"
    assert states[-1].timezone == "Asia/Tokyo"
    assert states[-1].updated_at == datetime.fromisoformat(second.json()["updated_at"])


def test_recipient_forms_hash_like_send_requests(client: httpx.Client,
                                                 auth: Callable[..., dict[str, str]]) -> None:
    email = fresh_email()
    mixed = email.replace("user", "User").replace("example.com", "EXAMPLE.com")
    r = client.put(prefs_url(mixed), headers=auth("acme"), json={})
    assert r.status_code == 200, r.text
    req = SendRequest.model_validate({"channel": "EMAIL", "tier": "P1", "recipient": mixed,
                                      "template_id": TEMPLATE, "template_version": 1})
    assert r.json()["recipient_hash"] == recipient_hash("acme", req.recipient_key())
    assert client.get(prefs_url(email), headers=auth("acme")).json()["version"] == 1

    token = fresh_ios_token()
    push = f"ios:{token}"
    r = client.put(prefs_url(push), headers=auth("acme"), json={"opt_outs": [{}]})
    assert r.status_code == 200, r.text
    assert r.json()["recipient_hash"] == recipient_hash("acme", push)
    assert token not in r.text

    phone = fresh_phone()
    encoded = client.put(f"/v1/recipients/%2B{phone[1:]}/preferences", headers=auth("acme"),
                         json={})
    assert encoded.json()["recipient_hash"] == recipient_hash("acme", phone)


def test_preference_rejections(client: httpx.Client,
                               auth: Callable[..., dict[str, str]]) -> None:
    phone = fresh_phone()
    r = client.put(prefs_url(phone), headers=auth("acme"), json={"timezone": "Mars/Olympus"})
    assert r.status_code == 422
    assert r.json()["reason"] == "invalid_body"
    assert r.json()["details"][0]["loc"] == ["timezone"]

    r = client.put(prefs_url(phone), headers=auth("acme"),
                   json={"quiet_hours": {"start": "22:00+02:00", "end": "07:00"}})
    assert r.status_code == 422

    r = client.put(prefs_url(phone), headers=auth("acme"),
                   json={"opt_outs": [{"channel": "FAX"}]})
    assert r.status_code == 422

    r = client.put(prefs_url(phone), headers=auth("acme"), json={"unknown": 1})
    assert r.status_code == 422

    for bad in ("not-an-address", "+12", "ios:short"):
        r = client.put(prefs_url(bad), headers=auth("acme"), json={})
        assert (r.status_code, r.json()["reason"]) == (422, "invalid_recipient"), bad
        assert r.json()["details"][0]["loc"] == ["path", "recipient"]
        assert client.get(prefs_url(bad), headers=auth("acme")).status_code == 422

    assert client.put(prefs_url(phone), json={}).status_code == 401
    assert client.get(prefs_url(phone), headers=auth("acme")).status_code == 404


def test_preferences_are_tenant_scoped(client: httpx.Client,
                                       auth: Callable[..., dict[str, str]]) -> None:
    phone = fresh_phone()
    a = client.put(prefs_url(phone), headers=auth("acme"), json={"timezone": "Europe/Paris"})
    assert a.status_code == 200
    assert client.get(prefs_url(phone), headers=auth("globex")).status_code == 404
    g = client.put(prefs_url(phone), headers=auth("globex"), json={"opt_outs": [{}]})
    assert g.status_code == 200
    assert g.json()["timezone"] != "Europe/Paris"
    assert g.json()["recipient_hash"] != a.json()["recipient_hash"]
    again = client.get(prefs_url(phone), headers=auth("acme")).json()
    assert (again["version"], again["timezone"], again["opt_outs"]) == (
        a.json()["version"], "Europe/Paris", [])


async def test_concurrent_updates_get_distinct_versions(
        api: str, auth: Callable[..., dict[str, str]], cql: Session) -> None:
    phone = fresh_phone()
    zones = ["Europe/Zurich", "Europe/Paris", "Asia/Tokyo", "America/New_York", "UTC"]
    async with httpx.AsyncClient(base_url=api, timeout=30.0) as c:
        replies = await asyncio.gather(*(
            c.put(prefs_url(phone), headers=auth("acme"), json={"timezone": z})
            for z in zones))
    assert [r.status_code for r in replies] == [200] * len(zones), [r.text for r in replies]
    versions = sorted(r.json()["version"] for r in replies)
    # a write whose Paxos round timed out and was applied after all is written once more
    # when another came between (adapters/cassandra/recipients.py, change_state): a gap, never
    # a shared version
    assert len(set(versions)) == 5 and versions[0] == 1, versions
    last = max(replies, key=lambda r: r.json()["version"]).json()
    row = stored_state(cql, "acme", recipient_hash("acme", phone))
    assert row is not None and (row["version"], row["timezone"]) == (versions[-1],
                                                                     last["timezone"])


# ----------------------------------------------------------------------------- devices


def test_device_delete_suppresses_and_put_reactivates(
        client: httpx.Client, auth: Callable[..., dict[str, str]], cql: Session,
        settings: Settings) -> None:
    owner = fresh_email()
    token = fresh_ios_token()
    push_hash = recipient_hash("acme", f"ios:{token}")
    owner_hash = recipient_hash("acme", owner)

    r = client.put(device_url(owner, token), headers=auth("acme"), json={"platform": "ios"})
    assert r.status_code == 200, r.text
    assert (r.json()["active"], r.json()["platform"], r.json()["suppressed"]) == (
        True, "ios", None)
    assert token not in r.text and owner not in r.text
    row = cql.execute("SELECT * FROM device_tokens WHERE tenant_id = %s AND recipient_id = %s "
                      "AND device_token = %s", ("acme", owner_hash, token)).one()
    assert row is not None and row["active"] is True and row["platform"] == "ios"
    assert stored_state(cql, "acme", push_hash) is None

    d = client.delete(device_url(owner, token), headers=auth("acme"))
    assert d.status_code == 204, d.text
    row = cql.execute("SELECT * FROM device_tokens WHERE tenant_id = %s AND recipient_id = %s "
                      "AND device_token = %s", ("acme", owner_hash, token)).one()
    assert (row["active"], row["deactivated_reason"]) == (False, "deleted_by_client")
    state = stored_state(cql, "acme", push_hash)
    assert state is not None and (state["suppressed"], state["version"]) == (
        "token_deactivated", 1)
    view = client.get(prefs_url(f"ios:{token}"), headers=auth("acme")).json()
    assert view["suppressed"] == "token_deactivated"

    assert client.delete(device_url(owner, token), headers=auth("acme")).status_code == 204
    state = stored_state(cql, "acme", push_hash)
    assert state is not None and state["version"] == 1

    kept = client.put(prefs_url(f"ios:{token}"), headers=auth("acme"),
                      json={"opt_outs": [{"category": "marketing"}]})
    assert kept.status_code == 200
    assert (kept.json()["suppressed"], kept.json()["version"]) == ("token_deactivated", 2)

    again = client.put(device_url(owner, token), headers=auth("acme"), json={"platform": "ios"})
    assert again.status_code == 200
    assert again.json()["suppressed"] is None
    state = stored_state(cql, "acme", push_hash)
    assert state is not None and (state["suppressed"], state["version"]) == (None, 3)
    assert state["opt_outs"] == ["*/marketing"]
    repeat = client.put(device_url(owner, token), headers=auth("acme"), json={"platform": "ios"})
    assert repeat.status_code == 200
    state = stored_state(cql, "acme", push_hash)
    assert state is not None and state["version"] == 3

    states = published(settings, "acme", push_hash)
    assert sorted({s.version for s in states}) == [1, 2, 3]
    assert states[-1].version == 3 and states[-1].suppressed is None
    assert {s.suppressed for s in states if s.version == 1} == {"token_deactivated"}


def test_device_rejections_and_scoping(client: httpx.Client,
                                       auth: Callable[..., dict[str, str]]) -> None:
    owner = fresh_phone()
    token = fresh_ios_token()
    assert client.delete(device_url(owner, token), headers=auth("acme")).status_code == 404

    r = client.put(device_url(owner, token), headers=auth("acme"), json={"platform": "fax"})
    assert (r.status_code, r.json()["reason"]) == (422, "invalid_body")
    r = client.put(device_url(owner, "xyz"), headers=auth("acme"), json={"platform": "ios"})
    assert (r.status_code, r.json()["reason"]) == (422, "invalid_device_token")
    assert r.json()["details"][0]["loc"] == ["path", "token"]
    r = client.put(device_url(f"ios:{token}", token), headers=auth("acme"),
                   json={"platform": "ios"})
    assert (r.status_code, r.json()["reason"]) == (422, "invalid_recipient")

    fcm = "f" * 20 + ":APA91b" + "x" * 40
    r = client.put(device_url(owner, fcm), headers=auth("acme"), json={"platform": "android"})
    assert r.status_code == 200, r.text
    assert client.delete(device_url(owner, fcm), headers=auth("globex")).status_code == 404
    assert client.delete(device_url(owner, fcm), headers=auth("acme")).status_code == 204
    state = client.get(prefs_url(f"android:{fcm}"), headers=auth("acme")).json()
    assert state["suppressed"] == "token_deactivated"
    assert client.get(prefs_url(f"android:{fcm}"), headers=auth("globex")).status_code == 404


# ------------------------------------------------------------------------ admission


@pytest.fixture
async def redis_client(stack: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(stack.redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def test_token_buckets_in_redis(redis_client: aioredis.Redis) -> None:
    store = AdmissionStore(redis_client, f"t-{uuid.uuid4().hex[:8]}:")
    a = Bucket(store.tenant_key("a"), rate=10.0, burst=10.0)
    empty = Bucket(store.tenant_key("b"), rate=0.5, burst=1.0)
    assert (await store.take([empty])).admitted
    denied = await store.take([a, empty])
    assert denied.denied == 1
    assert 1.0 < denied.wait_s <= 2.0
    granted = [(await store.take([a])).admitted for _ in range(12)]
    assert granted[:10] == [True] * 10
    assert granted.count(True) <= 11
    last = await store.take([a])
    assert not last.admitted and 0 < last.wait_s <= 0.1
    ttl = await redis_client.pttl(store.tenant_key("a"))
    assert 0 < ttl <= 2100


async def test_backlog_sheds_p3_not_p1(client: httpx.Client, api: str,
                                       auth: Callable[..., dict[str, str]], settings: Settings,
                                       redis_client: aioredis.Redis, otp_template: str) -> None:
    accepted_key = key()
    first = client.post("/v1/messages", headers=auth("mkt", accepted_key), json=sms(tier="P3"))
    assert first.status_code == 202, first.text
    hour_ago = time.time() - 3600
    await report(redis_client, settings.topic_prefix, Tier.P3, "test-reporter", hour_ago)
    try:
        async with httpx.AsyncClient(base_url=api, timeout=30.0) as c:

            async def shed() -> httpx.Response | None:
                r = await c.post("/v1/messages", headers=auth("mkt"), json=sms(tier="P3"))
                return r if r.status_code == 429 else None

            r = await wait_until(shed, timeout=10, interval=0.2, what="P3 shed")
            assert r is not None, "P3 was not shed"
            assert r.json()["error"] == "rate_limited"
            assert r.json()["reason"] == "backlog"
            assert int(r.headers["Retry-After"]) >= 1
            p1 = await c.post("/v1/messages", headers=auth("acme"), json=sms(tier="P1"))
            assert p1.status_code == 202, p1.text
            p2 = await c.post("/v1/messages", headers=auth("mkt"), json=sms(tier="P2"))
            assert p2.status_code == 202, p2.text
            replay = await c.post("/v1/messages", headers=auth("mkt", accepted_key),
                                  json=sms(tier="P3"))
            assert replay.status_code == 202
            assert replay.content == first.content
            await report(redis_client, settings.topic_prefix, Tier.P3, "test-reporter", None)

            async def admitted() -> httpx.Response | None:
                r = await c.post("/v1/messages", headers=auth("mkt"), json=sms(tier="P3"))
                return r if r.status_code == 202 else None

            assert await wait_until(admitted, timeout=10, interval=0.2,
                                    what="P3 admitted after the backlog cleared")
    finally:
        await redis_client.hdel(backlog_key(settings.topic_prefix, Tier.P3), "test-reporter")


def test_tenant_rate_limit(tight_api: httpx.Client,
                           auth: Callable[..., dict[str, str]]) -> None:
    k = key()
    first = tight_api.post("/v1/messages", headers=auth("limited", k), json=sms())
    assert first.status_code == 202, first.text
    limited = tight_api.post("/v1/messages", headers=auth("limited"), json=sms())
    assert limited.status_code == 429, limited.text
    assert limited.json()["error"] == "rate_limited"
    assert limited.json()["reason"] == "tenant_rate"
    assert 1 <= int(limited.headers["Retry-After"]) <= 5
    replay = tight_api.post("/v1/messages", headers=auth("limited", k), json=sms())
    assert replay.status_code == 202
    assert replay.content == first.content
    assert tight_api.post("/v1/messages", headers=auth("acme"), json=sms()).status_code == 202

    def refilled() -> bool:
        r = tight_api.post("/v1/messages", headers=auth("limited"), json=sms())
        assert r.status_code in (202, 429), r.text
        return r.status_code == 202

    wait_for(refilled, timeout=10, interval=0.25, what="the tenant bucket to refill")


def test_p0_capacity_envelope(tight_api: httpx.Client,
                              auth: Callable[..., dict[str, str]]) -> None:
    replies = [tight_api.post("/v1/messages", headers=auth("acme"), json=sms(tier="P0"))
               for _ in range(3)]
    codes = [r.status_code for r in replies]
    assert codes[0] == 202 and 429 in codes, [r.text for r in replies]
    refused = next(r for r in replies if r.status_code == 429)
    assert refused.json()["reason"] == "p0_capacity"
    assert 1 <= int(refused.headers["Retry-After"]) <= 5
    assert tight_api.post("/v1/messages", headers=auth("acme"),
                          json=sms(tier="P1")).status_code == 202


def test_redis_down_fails_open_for_p0_p1_closed_for_p2_p3(
        log_dir: Path, auth: Callable[..., dict[str, str]], stack: Settings,
        otp_template: str) -> None:
    proc, base = start_api("api-noredis", log_dir,
                           NOTIFLOW_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    try:
        with httpx.Client(base_url=base, timeout=30.0) as c:
            for tier in ("P0", "P1"):
                r = c.post("/v1/messages", headers=auth("acme"), json=sms(tier=tier))
                assert r.status_code == 202, r.text
            for tier in ("P2", "P3"):
                r = c.post("/v1/messages", headers=auth("mkt"), json=sms(tier=tier))
                assert r.status_code == 503, r.text
                assert r.json()["reason"] == "admission_unavailable"
                assert r.headers["Retry-After"] == "5"
    finally:
        proc.stop()

