"""Sends to a user against the real API: the channel chosen from the user's addresses and
stored preferences, one ingest record per chosen address, the decision shown by ``GET``,
idempotent replays, batches and refusals."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.adapters.envelope import envelope, load
from notiflow.redact import user_hash
from notiflow.schemas.enums import Channel, PushPlatform, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
from tests.helpers import fresh_email, fresh_ios_token, fresh_phone
from tests.integration.api.support import find_record, key

pytestmark = pytest.mark.integration

TEMPLATES = {"PUSH": "order-shipped-push", "SMS": "order-shipped-sms",
             "EMAIL": "order-shipped-email"}


@pytest.fixture(scope="module")
def templates(client: httpx.Client, auth: Callable[..., dict[str, str]]) -> None:
    for channel, template_id in TEMPLATES.items():
        r = client.post("/v1/templates", headers=auth("acme"), json={
            "template_id": template_id, "version": 1, "channel": channel,
            "subject": "Shipped" if channel == "EMAIL" else None,
            "body": "Order {{ order }} shipped"})
        assert r.status_code in (200, 201), r.text


class Person(NamedTuple):
    """A user of tenant ``acme`` with addresses of its own (tests opt them out)."""

    uid: str
    phone: str
    email: str
    ios: str


@pytest.fixture
def person(client: httpx.Client, auth: Callable[..., dict[str, str]],
           templates: None) -> Person:
    who = Person(f"user-{uuid.uuid4().hex[:10]}", fresh_phone(), fresh_email(),
                 fresh_ios_token())
    r = client.put(f"/v1/users/{who.uid}", headers=auth("acme"), json={
        "phones": [who.phone], "emails": [who.email],
        "devices": [{"platform": "ios", "token": who.ios}],
        "in_app": False, "timezone": "Europe/Paris"})
    assert r.status_code == 201, r.text
    return who


@pytest.fixture
def user(person: Person) -> str:
    return person.uid


def send(uid: str, *channels: str, **over: Any) -> dict[str, Any]:
    return {"recipient": f"user:{uid}", "tier": "P1",
            "channels": [{"channel": c, "template_id": TEMPLATES[c], "template_version": 1}
                         for c in channels],
            "variables": {"order": "A-1"}, **over}


def opt_out(client: httpx.Client, auth: Callable[..., dict[str, str]], address: str,
            channel: str) -> int:
    r = client.put(f"/v1/recipients/{quote(address, safe='')}/preferences",
                   headers=auth("acme"),
                   json={"opt_outs": [{"channel": channel, "category": "transactional"}]})
    assert r.status_code == 200, r.text
    return int(r.json()["version"])


def test_the_first_channel_that_may_receive_it_gets_it(
        client: httpx.Client, auth: Callable[..., dict[str, str]], person: Person,
        stack: Settings) -> None:
    user = person.uid
    r = client.post("/v1/messages", headers=auth("acme"),
                    json=send(user, "PUSH", "SMS", "EMAIL"))
    assert r.status_code == 202, r.text
    body = r.json()
    parent = body["message_id"]
    assert r.headers["Location"] == f"/v1/messages/{parent}"
    assert (body["status"], body["deliver"]) == ("QUEUED", "first")
    assert [(m["channel"], m["message_id"]) for m in body["messages"]] == [
        ("PUSH", f"{parent}-push0")]
    assert body["messages"][0]["address"].startswith(f"ios:{person.ios[:4]}")
    assert person.ios not in r.text and person.phone not in r.text
    assert body["skipped"] == [{"channel": "SMS", "index": None, "reason": "not_needed"},
                               {"channel": "EMAIL", "index": None, "reason": "not_needed"}]
    record = find_record(stack, stack.ingest_topic(Channel.PUSH, Tier.P1), f"{parent}-push0")
    sent = load(record.value() or b"", envelope(stack))
    assert (sent.recipient, sent.template_id, sent.variables) == (
        PushRecipient(device_token=person.ios, platform=PushPlatform.IOS), TEMPLATES["PUSH"],
        {"order": "A-1"})
    assert sent.user is not None and sent.user.timezone == "Europe/Paris"
    assert user not in sent.user.user_hash

    view = client.get(f"/v1/messages/{parent}", headers=auth("acme"))
    assert view.status_code == 200, view.text
    shown = view.json()
    assert (shown["recipient"], shown["tier"], shown["category"]) == (
        "user", "P1", "transactional")
    assert shown["messages"][0]["status"] in ("QUEUED", "PROCESSING", "PROVIDER_ACCEPTED",
                                              "SENT", "DELIVERED", "FAILED")
    assert shown["skipped"] == body["skipped"]
    child = client.get(f"/v1/messages/{parent}-push0", headers=auth("acme"))
    assert (child.status_code, child.json()["channel"]) == (200, "PUSH")
    assert client.get(f"/v1/messages/{parent}", headers=auth("globex")).status_code == 404


def test_an_opt_out_moves_the_next_message_to_the_next_channel(
        client: httpx.Client, auth: Callable[..., dict[str, str]], person: Person) -> None:
    user = person.uid
    version = opt_out(client, auth, f"ios:{person.ios}", "PUSH")
    r = client.post("/v1/messages", headers=auth("acme"),
                    json=send(user, "PUSH", "SMS", "EMAIL"))
    assert r.status_code == 202, r.text
    body = r.json()
    assert [m["channel"] for m in body["messages"]] == ["SMS"]
    assert body["skipped"] == [{"channel": "PUSH", "index": 0, "reason": "opted_out"},
                               {"channel": "EMAIL", "index": None, "reason": "not_needed"}]
    assert version >= 1

    every = client.post("/v1/messages", headers=auth("acme"),
                        json=send(user, "PUSH", "SMS", "EMAIL", deliver="every"))
    assert [m["channel"] for m in every.json()["messages"]] == ["SMS", "EMAIL"]

    opt_out(client, auth, person.phone, "SMS")
    none = client.post("/v1/messages", headers=auth("acme"), json=send(user, "PUSH", "SMS"))
    assert none.status_code == 202, none.text
    assert (none.json()["status"], none.json()["messages"]) == ("SUPPRESSED", [])
    assert [s["reason"] for s in none.json()["skipped"]] == ["opted_out", "opted_out"]
    assert client.get(f"/v1/messages/{none.json()['message_id']}",
                      headers=auth("acme")).json()["status"] == "SUPPRESSED"


def test_a_key_replays_the_decision_and_refuses_another_body(
        client: httpx.Client, auth: Callable[..., dict[str, str]], user: str) -> None:
    k = key()
    first = client.post("/v1/messages", headers=auth("acme", k), json=send(user, "SMS"))
    assert first.status_code == 202, first.text
    again = client.post("/v1/messages", headers=auth("acme", k), json=send(user, "SMS"))
    assert (again.status_code, again.json()) == (202, first.json())
    assert again.headers["Idempotent-Replayed"] == "true"
    other = client.post("/v1/messages", headers=auth("acme", k), json=send(user, "EMAIL"))
    assert other.status_code == 409, other.text


def test_refusals_name_their_rule(client: httpx.Client,
                                  auth: Callable[..., dict[str, str]], user: str) -> None:
    unknown = client.post("/v1/messages", headers=auth("acme"), json=send("nobody-x", "SMS"))
    assert (unknown.status_code, unknown.json()["reason"]) == (422, "unknown_user")
    twice = client.post("/v1/messages", headers=auth("acme"), json=send(user, "SMS", "SMS"))
    assert twice.status_code == 422
    assert "each channel is listed once" in twice.text
    other_tenant = client.post("/v1/messages", headers=auth("globex"), json=send(user, "SMS"))
    assert other_tenant.status_code == 422, other_tenant.text


def test_a_batch_item_may_name_a_user(client: httpx.Client,
                                      auth: Callable[..., dict[str, str]], user: str) -> None:
    r = client.post("/v1/messages:batch", headers=auth("acme"), json={"messages": [
        {**send(user, "EMAIL"), "idempotency_key": key()},
        send("nobody-y", "SMS")]})
    assert r.status_code == 200, r.text
    ok, refused = r.json()["results"]
    assert (ok["code"], [m["channel"] for m in ok["messages"]]) == (202, ["EMAIL"])
    assert (refused["code"], refused["reason"]) == (422, "unknown_user")


def test_the_users_own_opt_out_moves_every_address_of_that_channel(
        client: httpx.Client, auth: Callable[..., dict[str, str]], person: Person,
        cql: Session) -> None:
    user = person.uid
    empty = client.get(f"/v1/users/{user}/preferences", headers=auth("acme"))
    assert (empty.status_code, empty.json()["version"], empty.json()["opt_outs"]) == (
        200, 0, [])
    assert empty.json()["required"] == ["otp", "security"]
    r = client.put(f"/v1/users/{user}/preferences", headers=auth("acme"), json={
        "opt_outs": [{"channel": "PUSH", "category": "transactional"}]})
    assert r.status_code == 200, r.text
    version = r.json()["version"]
    assert version >= 1 and person.ios not in r.text

    sent = client.post("/v1/messages", headers=auth("acme"),
                       json=send(user, "PUSH", "SMS", "EMAIL"))
    assert sent.status_code == 202, sent.text
    assert [m["channel"] for m in sent.json()["messages"]] == ["SMS"]
    assert sent.json()["skipped"][0] == {"channel": "PUSH", "index": 0, "reason": "opted_out"}
    shown = client.get(f"/v1/messages/{sent.json()['message_id']}", headers=auth("acme"))
    assert shown.json()["user_preferences_version"] == version

    code = client.post("/v1/messages", headers=auth("acme"),
                       json=send(user, "PUSH", "SMS", category="otp"))
    assert [m["channel"] for m in code.json()["messages"]] == ["PUSH"]
    refused = client.put(f"/v1/users/{user}/preferences", headers=auth("acme"), json={
        "opt_outs": [{"channel": "*", "category": "security"}]})
    assert (refused.status_code, refused.json()["reason"]) == (422, "invalid_body")
    assert client.get(f"/v1/users/{user}/preferences",
                      headers=auth("globex")).status_code == 404
    assert client.put("/v1/users/nobody-z/preferences", headers=auth("acme"),
                      json={"opt_outs": []}).status_code == 404

    assert client.delete(f"/v1/users/{user}", headers=auth("acme")).status_code == 204
    assert client.get(f"/v1/users/{user}/preferences", headers=auth("acme")).status_code == 404
    kept = cql.execute("SELECT opt_outs FROM recipient_preferences WHERE tenant_id = %s AND "
                       "recipient_hash = %s", ("acme", user_hash("acme", user))).one()
    assert kept is not None and not kept["opt_outs"]
