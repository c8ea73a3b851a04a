"""Credentials rotated under a running API process, through its secrets directory: the new
tenant token and Twilio auth token work within a poll, the old ones until the rotation
window closes and not after, a directory that does not load changes nothing, and the
rotation is in the audit trail (by fingerprint only)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from notiflow.providers.twilio.signature import signed_url
from notiflow.settings import Settings
from tests.helpers import wait_for
from tests.integration.contract.test_contract_twilio import twilio_documented_signature
from tests.integration.test_audit import audit, audited

pytestmark = pytest.mark.integration

WINDOW_S = 4.0


def write(directory: Path, name: str, value: str) -> None:
    aside = directory / f".{name}.tmp"
    aside.write_text(value)
    os.replace(aside, directory / name)


def until(check: Callable[[], bool], timeout: float = 10.0) -> float:
    """Seconds until ``check()`` held; fails the test after ``timeout``."""
    start = time.monotonic()
    wait_for(check, timeout=timeout, interval=0.05, what="the reloaded credentials")
    return time.monotonic() - start


def test_tokens_and_provider_secrets_rotate_without_a_restart(
        isolated: Callable[..., Any], stack: Settings, tmp_path: Path) -> None:
    tenant = f"rot{uuid.uuid4().hex[:8]}"
    old, new = uuid.uuid4().hex, uuid.uuid4().hex
    twilio_old, twilio_new = uuid.uuid4().hex, uuid.uuid4().hex
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    write(secrets, "NOTIFLOW_TENANTS", json.dumps([{"id": tenant, "token": old}]))
    write(secrets, "NOTIFLOW_TWILIO__AUTH_TOKEN", twilio_old)
    iso = isolated(f"rot{uuid.uuid4().hex[:6]}", NOTIFLOW_SECRETS_DIR=str(secrets),
                   NOTIFLOW_SECRETS_POLL="PT0.2S",
                   NOTIFLOW_SECRETS_ROTATION_WINDOW=f"PT{WINDOW_S}S")
    base = iso.api()

    def status(token: str) -> int:
        """401 for a token the API does not take, 404 (no such message) for one it does."""
        return httpx.get(f"{base}/v1/messages/{uuid.uuid4()}", timeout=10,
                         headers={"Authorization": f"Bearer {token}"}).status_code

    def callback(token: str) -> int:
        url = f"{base}/webhooks/twilio"
        params = {"MessageSid": "SM" + uuid.uuid4().hex, "MessageStatus": "queued",
                  "AccountSid": stack.twilio.account_sid}
        signature = twilio_documented_signature(
            token, signed_url(url, stack.twilio.status_callback_url), params)
        return httpx.post(url, data=params, timeout=10,
                          headers={"X-Twilio-Signature": signature}).status_code

    assert (status(old), status(new)) == (404, 401)
    assert (callback(twilio_old), callback(twilio_new)) == (200, 403)

    write(secrets, "NOTIFLOW_TENANTS", json.dumps([{"id": tenant, "token": new}]))
    write(secrets, "NOTIFLOW_TWILIO__AUTH_TOKEN", twilio_new)
    rotated = time.monotonic()
    took = until(lambda: status(new) == 404 and callback(twilio_new) == 200)
    assert took < 3.0
    assert (status(old), callback(twilio_old)) == (404, 200)
    assert (status(uuid.uuid4().hex), callback(uuid.uuid4().hex)) == (401, 403)

    until(lambda: status(old) == 401, timeout=WINDOW_S + 5)
    assert time.monotonic() - rotated >= WINDOW_S - 0.5
    assert callback(twilio_old) == 403
    assert (status(new), callback(twilio_new)) == (404, 200)

    write(secrets, "NOTIFLOW_TENANTS", "[{broken")
    wait_for(lambda: "does not load" in (iso.log_dir / "api.log").read_text(), timeout=10,
             interval=0.05, what="the broken file refused")
    assert status(new) == 404
    assert "does not load" in (iso.log_dir / "api.log").read_text()

    def rotation_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [r for r in rows if r["subject"] == f"tenant:{tenant}"]

    rows = rotation_rows(audited(lambda rows: len(rotation_rows(rows)) >= 2,
                                 "--action", "tenant.policy"))
    assert sorted(r["detail"]["first"] for r in rows) == [False, True]
    assert [r["detail"]["changed"] for r in rows if not r["detail"]["first"]] == [["token"]]
    assert old not in json.dumps(rows) and new not in json.dumps(rows)
    twilio = [r for r in audit("--action", "credentials.rotated")
              if r["subject"] == "credentials:twilio"]
    assert twilio and twilio_new not in json.dumps(twilio)
