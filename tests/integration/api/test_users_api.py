"""Users against the real stack: the Cassandra port keeps the port's contract (lightweight
transactions under concurrent writers), the API stores profiles sealed and publishes them
without addresses, a batch imports each user on its own, and an erasure forgets what the
platform keeps by the user's addresses."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pytest
from cassandra.cluster import Session

from notiflow.adapters.cassandra.session import Statements, connect
from notiflow.adapters.cassandra.users import CassandraUsers
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.inbox_store import InboxItem, InboxStore
from notiflow.redact import recipient_hash
from notiflow.settings import Settings
from tests.helpers import read_topic
from tests.user_records_contract import check_user_records

pytestmark = pytest.mark.integration

IOS = "c3" * 32
ANDROID = "d" * 152


def profile(**over: Any) -> dict[str, Any]:
    return {"phones": ["+33612345678"], "emails": ["ana@example.com"],
            "devices": [{"platform": "ios", "token": IOS}], "locale": "fr-fr",
            "timezone": "Europe/Paris", "properties": {"first_name": "Ana"}, **over}


def new_id() -> str:
    return f"user-{uuid.uuid4().hex[:10]}"


def test_the_cassandra_port_keeps_the_contract(stack: Settings) -> None:
    async def run() -> None:
        cluster, session = await asyncio.to_thread(connect, stack)
        try:
            records = CassandraUsers(Statements(session), DlqCipher.from_settings(stack))
            await check_user_records(records, tenant=f"contract{uuid.uuid4().hex[:6]}")
        finally:
            cluster.shutdown()

    asyncio.run(run())


def test_a_user_is_written_read_patched_and_published_without_addresses(
        client: httpx.Client, auth: Callable[..., dict[str, str]], cql: Session,
        stack: Settings) -> None:
    uid = new_id()
    r = client.put(f"/v1/users/{uid}", headers=auth("acme"), json=profile())
    assert r.status_code == 201, r.text
    created = r.json()
    assert (created["user_id"], created["version"], created["locale"], created["emails"]) == (
        uid, 1, "fr-FR", ["ana@example.com"])
    r = client.put(f"/v1/users/{uid}", headers=auth("acme"), json=profile())
    assert (r.status_code, r.json()["version"]) == (200, 1)

    r = client.patch(f"/v1/users/{uid}", headers=auth("acme"),
                     json={"locale": "de", "properties": {"plan": "pro"}})
    assert r.status_code == 200, r.text
    patched = r.json()
    assert (patched["version"], patched["locale"], patched["properties"]) == (
        2, "de", {"first_name": "Ana", "plan": "pro"})
    assert client.get(f"/v1/users/{uid}", headers=auth("acme")).json() == patched
    assert client.get(f"/v1/users/{uid}", headers=auth("globex")).status_code == 404

    row = cql.execute("SELECT * FROM users WHERE tenant_id = %s AND user_id = %s",
                      ("acme", uid)).one()
    assert row is not None and row["version"] == 2
    for address in ("+33612345678", "ana@example.com", IOS, "Ana"):
        assert address not in row["profile"]

    records = [m for m in read_topic(stack, stack.users_topic)
               if m.key() == f"acme:{uid}".encode()]
    states = [orjson.loads(m.value()) for m in records]
    assert [s["version"] for s in states] == [1, 1, 2]
    assert states[-1]["channels"]["SMS"] == [recipient_hash("acme", "+33612345678")]
    for m in records:
        for address in (b"+33612345678", b"ana@example.com", IOS.encode()):
            assert address not in m.value()


def test_bad_users_are_refused_with_a_reason(client: httpx.Client,
                                             auth: Callable[..., dict[str, str]]) -> None:
    r = client.put("/v1/users/bad%20id", headers=auth("acme"), json=profile())
    assert (r.status_code, r.json()["reason"]) == (422, "invalid_user_id")
    r = client.put(f"/v1/users/{new_id()}", headers=auth("acme"),
                   json=profile(locale="french"))
    assert (r.status_code, r.json()["reason"]) == (422, "invalid_body")
    assert r.json()["details"][0]["loc"] == ["locale"]
    r = client.put(f"/v1/users/{new_id()}", headers=auth("acme"),
                   json=profile(chat_webhooks=["http://169.254.169.254/latest/hook"]))
    assert (r.status_code, r.json()["reason"]) == (422, "webhook_url_not_allowed")
    r = client.patch(f"/v1/users/{new_id()}", headers=auth("acme"), json={"locale": "de"})
    assert r.status_code == 404
    assert client.delete(f"/v1/users/{new_id()}", headers=auth("acme")).status_code == 404


def test_a_batch_imports_each_user_on_its_own(client: httpx.Client,
                                              auth: Callable[..., dict[str, str]]) -> None:
    a, b = new_id(), new_id()
    body = {"users": [{"user_id": a, **profile()}, {"user_id": b, "phones": ["0612"]},
                      {"user_id": "no spaces", "emails": ["x@example.com"]},
                      {"user_id": b, "emails": ["b@example.com"]}]}
    r = client.post("/v1/users:batch", headers=auth("acme"), json=body)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["status"] for x in results] == [201, 422, 422, 201]
    assert results[1]["reason"].startswith("invalid_body: phones.0")
    assert client.get(f"/v1/users/{b}", headers=auth("acme")).json()["emails"] == [
        "b@example.com"]
    r = client.post("/v1/users:batch", headers=auth("acme"), json={"users": []})
    assert (r.status_code, r.json()["reason"]) == (422, "invalid_body")


def test_an_erasure_forgets_the_user_and_what_their_addresses_keep(
        client: httpx.Client, auth: Callable[..., dict[str, str]], cql: Session,
        stack: Settings) -> None:
    uid, email = new_id(), f"{uuid.uuid4().hex[:8]}@example.com"
    phone = f"+3361{uuid.uuid4().int % 10**7:07d}"
    acme = auth("acme")
    assert client.put(f"/v1/users/{uid}", headers=acme,
                      json=profile(phones=[phone], emails=[email])).status_code == 201
    r = client.put(f"/v1/recipients/{quote(phone)}/preferences", headers=acme, json={
        "timezone": "Europe/Paris", "opt_outs": [{"channel": "SMS", "category": "marketing"}]})
    assert r.status_code == 200, r.text
    r = client.put(f"/v1/recipients/{quote(email)}/devices/{ANDROID}", headers=acme,
                   json={"platform": "android"})
    assert r.status_code == 200, r.text
    inbox = InboxStore(cql, stack)
    now = datetime.now(UTC)
    asyncio.run(inbox.put(InboxItem("acme", uid, "m-1", now, "P1", "transactional", 1,
                                    "Hi", "Your parcel"), now))

    assert client.delete(f"/v1/users/{uid}", headers=acme).status_code == 204
    assert client.get(f"/v1/users/{uid}", headers=acme).status_code == 404
    prefs = client.get(f"/v1/recipients/{quote(phone)}/preferences", headers=acme).json()
    assert (prefs["timezone"], prefs["opt_outs"]) == (None, [])
    device = client.get(f"/v1/recipients/{quote(email)}/devices/{ANDROID}", headers=acme)
    assert device.status_code == 404
    assert asyncio.run(inbox.page("acme", uid, None, 10)) == []
    assert cql.execute("SELECT * FROM device_owners WHERE tenant_id = %s AND token_hash = %s",
                       ("acme", recipient_hash("acme", f"android:{ANDROID}"))).one() is None
    last = [m for m in read_topic(stack, stack.users_topic)
            if m.key() == f"acme:{uid}".encode()][-1]
    assert last.value() is None
    assert client.delete(f"/v1/users/{uid}", headers=acme).status_code == 404
