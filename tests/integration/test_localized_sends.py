"""Localized sends end to end, through the API, the P1 send flow and the SMS provider's
emulator: a French user reads the ``fr`` variant, a Canadian one ``fr-CA``, a German one
(no ``de`` variant) and one without a locale the default, and a request's own ``locale``
wins over the user's."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.ops.procs import ManagedProcess
from tests.helpers import SUCCESS, emulator_records, fresh_phone, message_row, wait_for

pytestmark = pytest.mark.integration


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def template_id(api: str, tokens: dict[str, str]) -> str:
    tid = f"greeting-{uuid.uuid4().hex[:8]}"
    r = httpx.post(f"{api}/v1/templates", headers=bearer(tokens["acme"]), json={
        "template_id": tid, "version": 1, "channel": "SMS", "body": "Code {{ code }}",
        "locales": {"fr": {"body": "Votre code {{ code }}"},
                    "fr-CA": {"body": "Ton code {{ code }}"}}})
    assert r.status_code == 201, r.text
    return tid


def delivered_body(cql: Session, fakes: str, message_id: str) -> str:
    wait_for(lambda: (r := message_row(cql, message_id)) and r["status"] in SUCCESS,
             what=f"{message_id} accepted by the provider")
    [record] = emulator_records(fakes, message_id)
    return str(record["body"])


def to_user(api: str, token: str, template_id: str, user_locale: str | None,
            **over: Any) -> str:
    uid = f"user-{uuid.uuid4().hex[:10]}"
    r = httpx.put(f"{api}/v1/users/{uid}", headers=bearer(token), json={
        "phones": [fresh_phone()], "in_app": False, "locale": user_locale})
    assert r.status_code == 201, r.text
    r = httpx.post(f"{api}/v1/messages", headers=bearer(token), json={
        "recipient": f"user:{uid}", "tier": "P1", "variables": {"code": "4321"},
        "channels": [{"channel": "SMS", "template_id": template_id, "template_version": 1}],
        **over})
    assert r.status_code == 202, r.text
    return str(r.json()["messages"][0]["message_id"])


def test_each_user_reads_the_variant_of_their_locale(
        api: str, tokens: dict[str, str], template_id: str, send_p1: ManagedProcess,
        cql: Session, fakes: str) -> None:
    acme = tokens["acme"]
    sent = {
        "fr-FR user": to_user(api, acme, template_id, "fr-FR"),
        "fr-CA user": to_user(api, acme, template_id, "fr-ca"),
        "de user": to_user(api, acme, template_id, "de"),
        "no locale": to_user(api, acme, template_id, None),
        "de user, fr request": to_user(api, acme, template_id, "de", locale="fr"),
    }
    direct = httpx.post(f"{api}/v1/messages", headers=bearer(acme), json={
        "channel": "SMS", "tier": "P1", "recipient": fresh_phone(), "template_id": template_id,
        "template_version": 1, "variables": {"code": "4321"}, "locale": "fr-BE"})
    assert direct.status_code == 202, direct.text
    sent["address, fr-BE"] = direct.json()["message_id"]
    bodies = {who: delivered_body(cql, fakes, mid) for who, mid in sent.items()}
    assert bodies == {
        "fr-FR user": "Votre code 4321", "fr-CA user": "Ton code 4321",
        "de user": "Code 4321", "no locale": "Code 4321",
        "de user, fr request": "Votre code 4321", "address, fr-BE": "Votre code 4321"}
