"""``POST /v1/messages:batch`` against the real API, Cassandra and Kafka: one result per item in
order (202 / 4xx with the single endpoint's error body), each item's idempotency key honoured
on its own (replay → the original answer, another body → 409), whole-batch errors, and the
accepted items published like single acceptances."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings
from tests.integration.api.support import find_record

pytestmark = pytest.mark.integration

TEMPLATE = "batch-otp"


@pytest.fixture(scope="module")
def mkt(api: str, tokens: dict[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=60.0,
                      headers={"Authorization": f"Bearer {tokens['mkt']}"}) as c:
        r = c.post("/v1/templates", json={"template_id": TEMPLATE, "channel": "SMS",
                                          "body": "Your code is {{ code }}"})
        assert r.status_code in (200, 201), r.text
        yield c


def item(n: int, key: str | None = None, tier: str = "P2", **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"channel": "SMS", "tier": tier,
                            "recipient": f"+1415555{n % 10_000:04d}", "template_id": TEMPLATE,
                            "template_version": 1, "variables": {"code": f"{n:06d}"}}
    if key is not None:
        body["idempotency_key"] = key
    body.update(over)
    return body


def batch(client: httpx.Client, items: list[Any]) -> list[dict[str, Any]]:
    r = client.post("/v1/messages:batch", json={"messages": items})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == len(items)
    return list(results)


def test_each_item_gets_its_own_answer_in_order(mkt: httpx.Client, stack: Settings) -> None:
    run = uuid.uuid4().hex[:8]
    items: list[Any] = [item(i, f"{run}-{i}") for i in range(5)]
    items.insert(1, item(99, f"{run}-bad", recipient="not a phone"))
    items.insert(3, item(98, f"{run}-p1", tier="P1"))
    items.insert(5, "not an object")
    items.append(item(97, "has a space"))
    results = batch(mkt, items)
    statuses = [r["code"] for r in results]
    assert statuses == [202, 422, 202, 403, 202, 422, 202, 202, 400], results
    assert results[3]["error"] == "forbidden" and results[3]["reason"] == "tier_not_allowed"
    assert results[5]["reason"] == "invalid_item"
    assert results[8]["reason"] == "invalid_idempotency_key"
    accepted = [r for r in results if r["code"] == 202]
    assert len({r["message_id"] for r in accepted}) == 5
    for r in accepted:
        view = mkt.get(f"/v1/messages/{r['message_id']}")
        assert view.status_code == 200 and view.json()["tier"] == "P2"
    record = asyncio.run(asyncio.to_thread(
        find_record, stack, stack.ingest_topic(Channel.SMS, Tier.P2), accepted[-1]["message_id"]))
    assert record is not None


def test_keys_are_honoured_per_item(mkt: httpx.Client) -> None:
    run = uuid.uuid4().hex[:8]
    first = batch(mkt, [item(i, f"{run}-{i}") for i in range(3)] + [item(3)])
    again = batch(mkt, [item(i, f"{run}-{i}") for i in range(3)] + [item(3)])
    assert [r["message_id"] for r in again[:3]] == [r["message_id"] for r in first[:3]]
    assert all(r.get("replayed") is True for r in again[:3])
    assert again[3]["message_id"] != first[3]["message_id"] and "replayed" not in again[3]
    assert all(r["status"] == "QUEUED" for r in first)
    conflict = batch(mkt, [item(7, f"{run}-0")])
    assert conflict[0]["code"] == 409 and conflict[0]["error"] == "idempotency_conflict"
    single = mkt.post("/v1/messages", json=item(1), headers={"Idempotency-Key": f"{run}-1"})
    assert single.status_code == 202 and single.json()["message_id"] == first[1]["message_id"]


def test_whole_batch_errors(mkt: httpx.Client, api: str) -> None:
    for body, reason in (({"messages": []}, "invalid_batch"), ({}, "invalid_batch"),
                         ({"messages": [item(i) for i in range(1001)]}, "batch_too_large")):
        r = mkt.post("/v1/messages:batch", json=body)
        assert r.status_code == 422 and r.json()["reason"] == reason, r.text
    assert httpx.post(f"{api}/v1/messages:batch", json={"messages": [item(1)]}).status_code == 401
    r = mkt.post("/v1/messages:batch", content=b"[1, 2", headers={"Content-Type":
                                                                   "application/json"})
    assert r.status_code == 400


def test_a_thousand_items_in_one_call(mkt: httpx.Client) -> None:
    run = uuid.uuid4().hex[:8]
    results = batch(mkt, [item(i, f"{run}-{i}") for i in range(1000)])
    assert [r["code"] for r in results] == [202] * 1000
    assert len({r["message_id"] for r in results}) == 1000


def test_the_python_client_against_the_api(api: str, tokens: dict[str, str],
                                           mkt: httpx.Client) -> None:
    from notiflow.client import AsyncClient, Client, Conflict, Forbidden

    with Client(api, tokens["mkt"]) as nf:
        first = nf.send(item(1))
        again = nf.send(item(1), idempotency_key=first.idempotency_key)
        assert again.message_id == first.message_id and again.replayed
        assert nf.status(first.message_id)["tier"] == "P2"
        with pytest.raises(Conflict):
            nf.send(item(2), idempotency_key=first.idempotency_key)
        with pytest.raises(Forbidden):
            nf.send(item(3, tier="P1"))
        out = nf.send_batch([item(4), item(5, recipient="nope")])
        assert out[0].message_id.startswith("msg_")  # type: ignore[union-attr]
        assert type(out[1]).__name__ == "InvalidRequest"

    async def run() -> list[str]:
        async with AsyncClient(api, tokens["mkt"]) as anf:
            got = await asyncio.gather(*(anf.send(item(i)) for i in range(10, 20)))
            return [g.message_id for g in got]

    assert len(set(asyncio.run(run()))) == 10
