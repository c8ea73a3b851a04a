"""The in-app inbox end to end: messages to ``inapp:<user id>`` through the
API and the P0/P1 send flows into the user's inbox (Cassandra), pushed live to a WebSocket and
to an event stream (with ``Last-Event-ID`` catch-up); user tokens a tenant signs (PyJWT);
monotonic read / seen / archived states synced to the user's other devices and reported as
receipts; ``GET /v1/inbox`` paging."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import aiohttp
import httpx
import jwt
import orjson
import pytest
from cassandra.cluster import Session

from notiflow.inbox.tokens import mint
from notiflow.ops.procs import ManagedProcess
from notiflow.settings import Settings
from tests.helpers import create_template, message_row, wait_for

pytestmark = pytest.mark.integration


def key(settings: Settings, tenant: str = "acme") -> str:
    config = settings.tenant(tenant)
    assert config is not None and config.inbox_keys
    return config.inbox_keys[0].get_secret_value()


def token(settings: Settings, user: str, tenant: str = "acme", **kw: Any) -> str:
    return mint(key(settings, tenant), tenant, user, audience=settings.inbox.token_audience,
                **kw)


@pytest.fixture(scope="module")
def version(api: str, tokens: dict[str, str]) -> int:
    return create_template(api, tokens["acme"], template_id="inapp-alert", channel="INAPP",
                           subject="Security alert", body="New sign-in from {{ place }}")


def send(api: str, api_token: str, user: str, version: int, tier: str = "P0",
         place: str = "Lyon") -> str:
    r = httpx.post(f"{api}/v1/messages", headers={
        "Authorization": f"Bearer {api_token}", "Idempotency-Key": uuid.uuid4().hex}, json={
        "channel": "INAPP", "tier": tier, "recipient": f"inapp:{user}",
        "template_id": "inapp-alert", "template_version": version,
        "category": "security", "variables": {"place": place}})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


async def next_frame(ws: aiohttp.ClientWebSocketResponse, kind: str,
                     timeout: float = 20.0) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        while True:
            doc = orjson.loads(await ws.receive_str())
            if doc.get("type") == kind:
                return dict(doc)

    return await asyncio.wait_for(read(), timeout)


async def test_a_p0_alert_reaches_the_users_open_app_and_inbox(
        api: str, inbox: str, tokens: dict[str, str], version: int, send_p0: ManagedProcess,
        cql: Session, settings: Settings) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    async with aiohttp.ClientSession() as http, http.ws_connect(
            f"{inbox}/v1/inbox/ws", params={"access_token": token(settings, user)}) as ws:
        mid = await asyncio.to_thread(send, api, tokens["acme"], user, version)
        frame = await next_frame(ws, "item")
    item = frame["item"]
    assert (item["id"], item["subject"], item["body"], item["state"], item["tier"]) == (
        mid, "Security alert", "New sign-in from Lyon", "new", "P0")
    row = wait_for(lambda: (r := message_row(cql, mid)) and r["status"] == "PROVIDER_ACCEPTED"
                   and r, timeout=20, what="the message accepted by the inbox")
    assert row["recipient_masked"].startswith("inapp:")
    listed = httpx.get(f"{inbox}/v1/inbox",
                       headers={"Authorization": f"Bearer {token(settings, user)}"}).json()
    assert [i["id"] for i in listed["items"]] == [mid]
    stored = cql.execute("SELECT content FROM inbox_items WHERE tenant_id = 'acme' AND "
                         "user_id = %s", (user,)).one()
    assert b"Lyon" not in stored["content"]


async def test_the_event_stream_replays_what_a_reconnecting_client_missed(
        api: str, inbox: str, tokens: dict[str, str], version: int, send_p1: ManagedProcess,
        settings: Settings) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    params = {"access_token": token(settings, user)}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{inbox}/v1/inbox/events", params=params) as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            first = await asyncio.to_thread(send, api, tokens["acme"], user, version, "P1", "A")
            event = await asyncio.wait_for(read_event(stream), 20)
        assert event["event"] == "item" and first in event["data"]
        missed = [await asyncio.to_thread(send, api, tokens["acme"], user, version, "P1", p)
                  for p in ("B", "C")]
        await wait_listed(inbox, settings, user, 3)
        async with http.get(f"{inbox}/v1/inbox/events", params=params,
                            headers={"Last-Event-ID": event["id"]}) as again:
            replayed = [await asyncio.wait_for(read_event(again), 20) for _ in missed]
    assert [orjson.loads(e["data"])["item"]["id"] for e in replayed] == missed


async def read_event(stream: aiohttp.ClientResponse) -> dict[str, str]:
    """The next event of a ``text/event-stream`` (comments skipped)."""
    fields: dict[str, str] = {}
    while True:
        line = (await stream.content.readline()).decode().rstrip("\n")
        if line == "":
            if fields:
                return fields
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(": ")
        fields[name] = value


async def wait_listed(inbox: str, settings: Settings, user: str, n: int) -> list[dict[str, Any]]:
    def listed() -> list[dict[str, Any]] | None:
        items = httpx.get(f"{inbox}/v1/inbox", headers={
            "Authorization": f"Bearer {token(settings, user)}"}).json()["items"]
        return items if len(items) >= n else None

    return await asyncio.to_thread(wait_for, listed, 30, 0.25, f"{n} items listed")


async def test_states_only_move_forward_sync_devices_and_report_receipts(
        api: str, inbox: str, tokens: dict[str, str], version: int, send_p1: ManagedProcess,
        reconciler: ManagedProcess, cql: Session, settings: Settings) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    mid = await asyncio.to_thread(send, api, tokens["acme"], user, version, "P1")
    await wait_listed(inbox, settings, user, 1)
    auth = {"Authorization": f"Bearer {token(settings, user)}"}
    async with aiohttp.ClientSession() as http, http.ws_connect(
            f"{inbox}/v1/inbox/ws", params={"access_token": token(settings, user)}) as phone:
        read = await http.post(f"{inbox}/v1/inbox/{mid}/state", json={"state": "read"},
                               headers=auth)
        assert read.status == 200
        view = await read.json()
        assert view["state"] == "read" and view["seen_at"] and view["read_at"]
        synced = await next_frame(phone, "state")
        assert (synced["id"], synced["state"]) == (mid, "read")
        back = await (await http.post(f"{inbox}/v1/inbox/{mid}/state", json={"state": "seen"},
                                      headers=auth)).json()
        assert (back["state"], back["read_at"]) == ("read", view["read_at"])
        await phone.send_str(orjson.dumps({"type": "mark", "id": mid,
                                           "state": "archived"}).decode())
        assert (await next_frame(phone, "state"))["state"] == "archived"
        bad = await http.post(f"{inbox}/v1/inbox/{mid}/state", json={"state": "new"},
                              headers=auth)
        assert (bad.status, (await bad.json())["reason"]) == (422, "invalid_state")
        gone = await http.post(f"{inbox}/v1/inbox/nope/state", json={"state": "read"},
                               headers=auth)
        assert gone.status == 404
    listed = httpx.get(f"{inbox}/v1/inbox", headers=auth).json()["items"]
    assert listed == []
    archived = httpx.get(f"{inbox}/v1/inbox", headers=auth,
                         params={"include_archived": "true"}).json()["items"]
    assert [(i["id"], i["state"]) for i in archived] == [(mid, "archived")]
    row = wait_for(lambda: (r := message_row(cql, mid)) and r["status"] == "OPENED" and r,
                   timeout=30, what="the read reported as OPENED")
    assert row["status"] == "OPENED"


async def test_paging_walks_the_inbox_newest_first(
        api: str, inbox: str, tokens: dict[str, str], version: int, send_p1: ManagedProcess,
        settings: Settings) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    for place in "ABCDE":
        await asyncio.to_thread(send, api, tokens["acme"], user, version, "P1", place)
    await wait_listed(inbox, settings, user, 5)
    auth = {"Authorization": f"Bearer {token(settings, user)}"}
    pages, cursor = [], None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = httpx.get(f"{inbox}/v1/inbox", headers=auth, params=params).json()
        pages.append([i["body"][-1] for i in page["items"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(b for page in pages for b in page) == list("ABCDE")
    assert [len(p) for p in pages] == [2, 2, 1]
    stamps = [i["created_at"] for i in httpx.get(f"{inbox}/v1/inbox", headers=auth).json()[
        "items"]]
    assert stamps == sorted(stamps, reverse=True)
    bad = httpx.get(f"{inbox}/v1/inbox", headers=auth, params={"cursor": "x"})
    assert (bad.status_code, bad.json()["reason"]) == (400, "invalid_paging")


async def test_only_a_token_its_tenant_signed_opens_an_inbox(
        inbox: str, settings: Settings) -> None:
    user = "user-shared-id"

    def status(tok: str | None) -> tuple[int, str | None]:
        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
        r = httpx.get(f"{inbox}/v1/inbox", headers=headers)
        return r.status_code, r.json().get("reason")

    assert status(token(settings, user))[0] == 200
    assert status(None) == (401, "missing_token")
    assert status(mint("not-the-key" * 4, "acme", user)) == (401, "invalid_signature")
    assert status(token(settings, user, ttl=timedelta(seconds=-120))) == (401, "expired_token")
    assert status(token(settings, user, ttl=timedelta(days=3))) == (401, "lifetime_too_long")
    assert status(mint(key(settings), "acme", user, audience="other")) == (401, "invalid_claims")
    assert status(mint(key(settings), "nobody", user)) == (401, "unknown_issuer")
    unsigned = jwt.encode({"iss": "acme", "sub": user, "aud": "notiflow-inbox"}, None,
                          algorithm="none")
    assert status(unsigned) == (401, "wrong_algorithm")
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{inbox}/v1/inbox/ws", params={"access_token": "x.y.z"})
        assert refused.value.status == 401
    globex = httpx.get(f"{inbox}/v1/inbox", headers={
        "Authorization": f"Bearer {token(settings, user, tenant='globex')}"}).json()
    assert globex["items"] == []


async def test_a_users_connection_beyond_the_limit_closes_the_oldest(
        inbox: str, settings: Settings) -> None:
    user = f"user-{uuid.uuid4().hex[:8]}"
    url = f"{inbox}/v1/inbox/ws"
    limit = settings.inbox.max_connections_per_user
    async with aiohttp.ClientSession() as http:
        sockets = [await http.ws_connect(url, params={"access_token": token(settings, user)})
                   for _ in range(limit + 1)]
        closing = await asyncio.wait_for(sockets[0].receive(), 10)
        assert (closing.type, closing.data) == (aiohttp.WSMsgType.CLOSE, 4001)
        assert not sockets[-1].closed
        bad = await http.get(url, params={"access_token": token(settings, user),
                                          "since": "nope"})
        assert (bad.status, (await bad.json())["reason"]) == (400, "invalid_cursor")
        for ws in sockets:
            await ws.close()
