"""Localized templates against the real API: a version stored with its variants (tags in
their usual case) and shown by ``GET``, the same variants in another order are the same
version, other variants are another content, and a variant with other variables is
refused."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import httpx
import pytest

pytestmark = pytest.mark.integration

DEFAULT, FR, FR_CA = "Code {{ code }}", "Votre code {{ code }}", "Ton code {{ code }}"


@pytest.fixture(scope="module")
def template_id(client: httpx.Client, auth: Callable[..., dict[str, str]]) -> str:
    tid = f"greeting-{uuid.uuid4().hex[:8]}"
    r = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": tid, "version": 1, "channel": "SMS", "body": DEFAULT,
        "locales": {"fr": {"body": FR}, "FR-ca": {"body": FR_CA}}})
    assert r.status_code == 201, r.text
    assert r.json()["locales"] == ["fr", "fr-CA"]
    return tid


def test_a_version_keeps_its_variants_and_refuses_one_with_other_variables(
        client: httpx.Client, auth: Callable[..., dict[str, str]], template_id: str) -> None:
    shown = client.get(f"/v1/templates/{template_id}/versions/1", headers=auth("acme"))
    assert shown.status_code == 200, shown.text
    assert shown.json()["locales"] == {"fr": {"subject": None, "body": FR},
                                       "fr-CA": {"subject": None, "body": FR_CA}}
    again = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": template_id, "version": 1, "channel": "SMS", "body": DEFAULT,
        "locales": {"fr-CA": {"body": FR_CA}, "fr": {"body": FR}}})
    assert again.status_code == 200, again.text
    changed = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": template_id, "version": 1, "channel": "SMS", "body": DEFAULT,
        "locales": {"fr": {"body": FR}}})
    assert changed.status_code == 409, changed.text
    bad = client.post("/v1/templates", headers=auth("acme"), json={
        "template_id": template_id, "channel": "SMS", "body": DEFAULT,
        "locales": {"de": {"body": "Code {{ code }} für {{ name }}"}}})
    assert (bad.status_code, bad.json()["reason"], bad.json()["field"]) == (
        422, "locale_variables_differ", "locales.de")
