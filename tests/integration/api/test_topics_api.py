"""Topics against the real stack: the Cassandra port keeps the subscriptions contract; the API
adds the tenant's users to a topic (and names the unknown ones), pages through 250
subscribers once each, removes some, lists a user's topics and forgets them at erasure."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import httpx
import pytest

from notiflow.adapters.cassandra.session import Statements, connect
from notiflow.adapters.cassandra.topics import CassandraTopics
from notiflow.settings import Settings
from tests.helpers import fresh_phone
from tests.topic_subscriptions_contract import check_topic_subscriptions

pytestmark = pytest.mark.integration


def test_the_cassandra_port_keeps_the_contract(stack: Settings) -> None:
    async def run() -> None:
        cluster, session = await asyncio.to_thread(connect, stack)
        try:
            await check_topic_subscriptions(CassandraTopics(Statements(session)),
                                            tenant=f"contract{uuid.uuid4().hex[:6]}")
        finally:
            cluster.shutdown()

    asyncio.run(run())


def test_a_topic_gains_pages_loses_and_forgets_its_subscribers(
        client: httpx.Client, auth: Callable[..., dict[str, str]]) -> None:
    acme, run = auth("acme"), uuid.uuid4().hex[:8]
    ids = [f"fan-{run}-{i:03d}" for i in range(250)]
    r = client.post("/v1/users:batch", headers=acme,
                    json={"users": [{"user_id": u, "in_app": True} for u in ids]})
    assert r.status_code == 200, r.text
    topic = f"project-{run}"
    added = client.put(f"/v1/topics/{topic}/subscribers", headers=acme,
                       json={"users": [*ids, "nobody-here"]})
    assert (added.status_code, added.json()) == (
        200, {"subscribed": 250, "unknown": ["nobody-here"]})
    assert client.put(f"/v1/topics/{topic}/subscribers", headers=acme,
                      json={"users": ids[:5]}).json()["subscribed"] == 5

    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = client.get(f"/v1/topics/{topic}/subscribers", headers=acme,
                          params={"limit": 100, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        seen += page.json()["users"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 250

    removed = client.request("DELETE", f"/v1/topics/{topic}/subscribers", headers=acme,
                             json={"users": ids[:50]})
    assert (removed.status_code, removed.json()) == (200, {"unsubscribed": 50})
    assert client.get(f"/v1/users/{ids[0]}/topics", headers=acme).json() == {"topics": []}
    assert client.get(f"/v1/users/{ids[60]}/topics", headers=acme).json() == {
        "topics": [topic]}
    assert client.delete(f"/v1/users/{ids[60]}", headers=acme).status_code == 204
    rest = client.get(f"/v1/topics/{topic}/subscribers", headers=acme,
                      params={"limit": 1000}).json()
    assert len(rest["users"]) == 199 and ids[60] not in rest["users"]
    assert client.get(f"/v1/topics/{topic}/subscribers",
                      headers=auth("globex")).json()["users"] == []

    bad = client.put("/v1/topics/bad%20topic/subscribers", headers=acme,
                     json={"users": ids[:1]})
    assert (bad.status_code, bad.json()["reason"]) == (422, "invalid_topic")
    twice = client.put(f"/v1/topics/{topic}/subscribers", headers=acme,
                       json={"users": [ids[1], ids[1]]})
    assert twice.status_code == 422
    cursor_bad = client.get(f"/v1/topics/{topic}/subscribers", headers=acme,
                            params={"cursor": "bm90LWEtY3Vyc29y"})
    assert (cursor_bad.status_code, cursor_bad.json()["reason"]) == (422, "invalid_cursor")


def test_a_send_to_a_topic_is_a_campaign_checked_like_a_send_to_a_user(
        client: httpx.Client, auth: Callable[..., dict[str, str]]) -> None:
    mkt, run = auth("mkt"), uuid.uuid4().hex[:8]
    template = f"news-{run}"
    r = client.post("/v1/templates", headers=mkt, json={
        "template_id": template, "channel": "SMS",
        "body": "News: {{ item }}. Reply STOP to opt out."})
    assert r.status_code == 201, r.text
    option = {"channel": "SMS", "template_id": template, "template_version": 1}
    topic = f"news-{run}"
    r = client.post(f"/v1/topics/{topic}/messages", headers=mkt,
                    json={"channels": [option], "variables": {"item": "2.4"}})
    assert r.status_code == 201, r.text
    view = r.json()
    cid = view["campaign_id"]
    assert (view["topic"], view["state"], view["channel"], view["tier"]) == (
        topic, "scheduled", "SMS", "P3")
    assert view["manifest"].endswith(f"/mkt/topics/{cid}.jsonl")
    assert r.headers["Location"] == f"/v1/campaigns/{cid}"
    assert client.get(f"/v1/campaigns/{cid}", headers=mkt).json()["topic"] == topic
    assert client.post(f"/v1/campaigns/{cid}/cancel",
                       headers=mkt).json()["state"] == "cancelled"

    def refused(path_topic: str, body: dict[str, object]) -> tuple[int, str]:
        r = client.post(f"/v1/topics/{path_topic}/messages", headers=mkt, json=body)
        return r.status_code, r.json()["reason"]

    assert refused(topic, {"channels": [option]}) == (422, "missing_template_variable")
    assert refused("no spaces here", {"channels": [option]}) == (422, "invalid_topic")
    assert refused(topic, {"channels": [option, option]}) == (422, "invalid_body")
    assert refused(topic, {"channels": [option], "tier": "P1",
                           "variables": {"item": "x"}}) == (422, "invalid_body")
    other = {"channel": "SMS", "template_id": f"none-{run}", "template_version": 1}
    assert refused(topic, {"channels": [other]}) == (422, "unknown_template")


def test_a_user_mutes_topics_and_the_page_keeps_them(
        client: httpx.Client, auth: Callable[..., dict[str, str]]) -> None:
    acme, uid = auth("acme"), f"muter-{uuid.uuid4().hex[:8]}"
    assert client.put(f"/v1/users/{uid}", headers=acme,
                      json={"phones": [fresh_phone()]}).status_code == 201
    r = client.put(f"/v1/users/{uid}/preferences", headers=acme,
                   json={"opt_outs": [], "muted_topics": ["news", "deals"]})
    assert (r.status_code, r.json()["muted_topics"]) == (200, ["deals", "news"]), r.text
    assert client.get(f"/v1/users/{uid}/preferences",
                      headers=acme).json()["muted_topics"] == ["deals", "news"]
    for bad in (["news", "news"], ["no spaces"]):
        r = client.put(f"/v1/users/{uid}/preferences", headers=acme,
                       json={"muted_topics": bad})
        assert (r.status_code, r.json()["reason"]) == (422, "invalid_body")

    link = client.post(f"/v1/users/{uid}/preferences:link", headers=acme)
    assert link.status_code == 200, link.text
    page = "/" + link.json()["url"].split("/", 3)[3]
    saved = client.post(page, content="receive=transactional%3ASMS",
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert saved.status_code == 303, saved.text
    data = client.get(f"{page}/data").json()
    assert data["muted_topics"] == ["deals", "news"]
    assert {"channel": "SMS", "category": "marketing"} in data["opt_outs"]
    assert {"channel": "SMS", "category": "transactional"} not in data["opt_outs"]
