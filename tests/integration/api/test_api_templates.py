"""The Messaging API's templates against the real local stack: immutable versions, syntax
errors and channels."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest

from tests.integration.api.support import (
    sms,
)

pytestmark = pytest.mark.integration


def test_template_versions_are_immutable(client: httpx.Client,
                                         auth: Callable[..., dict[str, str]]) -> None:
    tid = f"tpl-{uuid.uuid4().hex[:8]}"
    first = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "subject": "Hi {{ name }}",
        "body": "Order {{ order_id }} arrives {{ eta }}"})
    assert first.status_code == 201, first.text
    created = first.json()
    assert created["version"] == 1
    assert created["variables"] == ["eta", "name", "order_id"]
    assert set(created) == {"template_id", "version", "channel", "variables", "checksum",
                            "created_at", "locales"}
    assert created["locales"] == []

    same = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "version": 1, "subject": "Hi {{ name }}",
        "body": "Order {{ order_id }} arrives {{ eta }}"})
    assert same.status_code == 200
    assert same.json() == created

    changed = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "version": 1, "body": "Different {{ x }}"})
    assert changed.status_code == 409
    assert changed.json()["error"] == "template_version_immutable"

    second = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "body": "Order {{ order_id }} is late"})
    assert second.status_code == 201
    assert second.json()["version"] == 2
    again = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "SMS", "body": "Order {{ order_id }} is late"})
    assert again.status_code == 200
    assert again.json() == second.json()

    got = client.get(f"/v1/templates/{tid}/versions/1", headers=auth("acme"))
    assert got.status_code == 200
    g = got.json()
    assert (g["subject"], g["body"], g["variables"]) == (
        "Hi {{ name }}", "Order {{ order_id }} arrives {{ eta }}", ["eta", "name", "order_id"])
    assert g["checksum"] == created["checksum"]
    assert g["created_at"] == created["created_at"]

    assert client.get(f"/v1/templates/{tid}/versions/1", headers=auth("globex")).status_code \
        == 404
    assert client.get(f"/v1/templates/{tid}/versions/9", headers=auth("acme")).status_code \
        == 404


def test_template_syntax_error_is_422(client: httpx.Client,
                                      auth: Callable[..., dict[str, str]]) -> None:
    r = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": "broken", "channel": "SMS", "body": "Hi {{ name"})
    assert r.status_code == 422
    assert r.json()["reason"] == "template_syntax_error"


def test_template_channel_must_match(client: httpx.Client,
                                     auth: Callable[..., dict[str, str]]) -> None:
    tid = f"push-{uuid.uuid4().hex[:8]}"
    r = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "channel": "PUSH", "body": "{{ code }}"})
    assert r.status_code == 201
    r = client.post("/v1/messages", headers=auth("acme"), json=sms(template_id=tid))
    assert (r.status_code, r.json()["reason"]) == (422, "unknown_template")
