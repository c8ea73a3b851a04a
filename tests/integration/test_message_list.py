"""``GET /v1/messages`` and ``notiflow messages`` on the real stack: newest first, paging by
cursor, the ``since`` bound, the status filter, tenant isolation, 422 on bad parameters."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session
from typer.testing import CliRunner

from notiflow.cli import app
from notiflow.ops.procs import ManagedProcess
from notiflow.redact import mask
from tests.helpers import hold, message_row, wait_for

pytestmark = pytest.mark.integration

ACCEPTANCE_GAP_S = 0.01
"""Between two sends: distinct acceptance times (ms), so the order is the send order."""

NUMBER = "+14155552671"
INVALID_NUMBER = "+15005550001"


def send(api: str, token: str, version: int, recipient: str = NUMBER) -> str:
    r = httpx.post(f"{api}/v1/messages", headers={
        "Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex},
        json={"channel": "SMS", "tier": "P1", "recipient": recipient, "template_id": "otp",
              "template_version": version, "variables": {"code": uuid.uuid4().hex[:6]}})
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def get(api: str, token: str, path: str = "/v1/messages", **params: Any) -> httpx.Response:
    return httpx.get(f"{api}{path}", params=params or None,
                     headers={"Authorization": f"Bearer {token}"})


def walk(api: str, token: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Every page, following ``next``."""
    pages = []
    r = get(api, token, **params)
    while True:
        assert r.status_code == 200, r.text
        body = r.json()
        pages.append(body["messages"])
        if body["next"] is None:
            assert body["next_cursor"] is None
            return pages
        r = get(api, token, body["next"])


@pytest.fixture(scope="module")
def sent(api: str, tokens: dict[str, str], otp_template: dict[str, int],
         send_p1: ManagedProcess, cql: Session) -> dict[str, Any]:
    """Five acme messages (the last one FAILED at the provider), two globex ones."""
    since = datetime.now(UTC) - timedelta(milliseconds=500)
    acme = []
    for i in range(5):
        acme.append(send(api, tokens["acme"], otp_template["acme"],
                         INVALID_NUMBER if i == 4 else NUMBER))
        hold(ACCEPTANCE_GAP_S)
    globex = [send(api, tokens["globex"], otp_template["globex"]) for _ in range(2)]
    wait_for(lambda: (message_row(cql, acme[4]) or {}).get("status") == "FAILED",
             what="the invalid number FAILED")
    return {"since": since, "acme": acme, "globex": globex}


def test_pages_newest_first_with_cursor(api: str, tokens: dict[str, str],
                                        sent: dict[str, Any]) -> None:
    pages = walk(api, tokens["acme"], since=sent["since"].isoformat(), limit=2)
    assert all(len(p) <= 2 for p in pages) and len(pages) >= 3
    ids = [m["message_id"] for p in pages for m in p]
    assert len(ids) == len(set(ids))
    assert [i for i in ids if i in sent["acme"]] == sent["acme"][::-1]
    first = pages[0][0]
    assert set(first) == {"message_id", "status", "reason", "channel", "tier", "category",
                          "template_id", "template_version", "attempt", "accepted_at",
                          "updated_at"}
    stamps = [m["accepted_at"] for p in pages for m in p]
    assert stamps == sorted(stamps, reverse=True)
    assert NUMBER not in str(pages) and mask(NUMBER) not in str(pages)


def test_since_bound_and_status_filter(api: str, tokens: dict[str, str], cql: Session,
                                       sent: dict[str, Any]) -> None:
    row = message_row(cql, sent["acme"][2])
    assert row is not None
    third = row["accepted_at"].replace(tzinfo=UTC)
    r = get(api, tokens["acme"], since=third.isoformat(), limit=50)
    assert r.status_code == 200, r.text
    ids = [m["message_id"] for m in r.json()["messages"]]
    assert [i for i in ids if i in sent["acme"]] == sent["acme"][:1:-1]  # 4, 3, 2
    failed = [m for p in walk(api, tokens["acme"], since=sent["since"].isoformat(),
                              status="FAILED") for m in p]
    assert sent["acme"][4] in [m["message_id"] for m in failed]
    assert all(m["status"] == "FAILED" for m in failed)
    assert failed[0]["reason"] == "invalid_recipient"


def test_tenant_isolation(api: str, tokens: dict[str, str], sent: dict[str, Any]) -> None:
    since = sent["since"].isoformat()
    globex = [m["message_id"] for p in walk(api, tokens["globex"], since=since) for m in p]
    assert set(sent["globex"]) <= set(globex)
    assert not set(sent["acme"]) & set(globex)
    acme_page = get(api, tokens["acme"], since=since, limit=1).json()
    assert acme_page["next_cursor"]
    other = get(api, tokens["globex"], since=since, limit=50, cursor=acme_page["next_cursor"])
    assert other.status_code == 200
    assert not set(sent["acme"]) & {m["message_id"] for m in other.json()["messages"]}
    assert get(api, "not-a-token").status_code == 401


@pytest.mark.parametrize("params, reason", [
    ({"limit": 0}, "invalid_request"),
    ({"limit": 201}, "invalid_request"),
    ({"limit": "many"}, "invalid_request"),
    ({"status": "NOPE"}, "invalid_request"),
    ({"since": "2026-11-30T00:00:00"}, "invalid_request"),  # no offset
    ({"since": "yesterday"}, "invalid_request"),
    ({"since": "FUTURE"}, "invalid_since"),
    ({"since": "ANCIENT"}, "invalid_since"),
    ({"cursor": "not-a-cursor"}, "invalid_cursor"),
])
def test_bad_parameters_are_422(api: str, tokens: dict[str, str], params: dict[str, Any],
                                reason: str) -> None:
    now = datetime.now(UTC)
    if params.get("since") == "FUTURE":
        params = {"since": (now + timedelta(hours=1)).isoformat()}
    elif params.get("since") == "ANCIENT":
        params = {"since": (now - timedelta(days=31)).isoformat()}
    r = get(api, tokens["acme"], **params)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_failed" and r.json()["reason"] == reason


def test_cli_lists_with_masked_recipients(sent: dict[str, Any]) -> None:
    result = CliRunner().invoke(app, ["messages", "--tenant", "acme", "--since", "10m",
                                      "--status", "FAILED"])
    assert result.exit_code == 0, result.output
    assert sent["acme"][4] in result.output
    assert mask(INVALID_NUMBER) in result.output and INVALID_NUMBER not in result.output
    assert not set(sent["acme"][:4]) & set(result.output.split())
    back = (datetime.now(UTC) - sent["since"]).total_seconds() + 1
    everyone = CliRunner().invoke(app, ["messages", "--since", f"{back:.0f}s", "--limit", "200"])
    assert everyone.exit_code == 0, everyone.output
    assert all(m in everyone.output for m in sent["acme"] + sent["globex"])
    assert NUMBER not in everyone.output
    bad = CliRunner().invoke(app, ["messages", "--since", "someday"])
    assert bad.exit_code == 2
