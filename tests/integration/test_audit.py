"""The audit trail against the real API and Cassandra: a template version created, P0
acceptances counted per tenant, a tenant policy changed by configuration (recorded once by
one of two processes), all read back by ``notiflow audit``."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.helpers import hold, wait_for

pytestmark = pytest.mark.integration

SECOND_WRITER_S = 3.0
"""How long the other API process has to write a duplicate policy row (it must not)."""


def audit(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run([".venv/bin/notiflow", "audit", "--since", "15m", "--json", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def audited(found: Callable[[list[dict[str, Any]]], bool], *args: str,
            timeout: float = 30) -> list[dict[str, Any]]:
    """The audit rows ``args`` select, once ``found`` holds for them."""
    def rows() -> list[dict[str, Any]] | None:
        got = audit(*args)
        return got if found(got) else None

    return wait_for(rows, timeout=timeout, interval=1.0, what=f"audit rows {args}")


def test_templates_p0_use_and_policy_changes_are_audited(
        isolated: Callable[..., Any], tokens: dict[str, str],
        otp_template: dict[str, int]) -> None:
    iso = isolated(f"audit{uuid.uuid4().hex[:6]}", NOTIFLOW_AUDIT_P0_INTERVAL="PT1S")
    base = iso.api()
    auth = {"Authorization": f"Bearer {tokens['acme']}"}
    api_pid = iso.processes.procs[-1].proc.pid
    template_id = f"audit-{uuid.uuid4().hex[:8]}"
    r = httpx.post(f"{base}/v1/templates", headers=auth, timeout=10,
                   json={"template_id": template_id, "channel": "SMS", "body": "Hi {{ n }}"})
    assert r.status_code == 201, r.text
    for _ in range(3):
        r = httpx.post(f"{base}/v1/messages", timeout=10,
                       headers={**auth, "Idempotency-Key": uuid.uuid4().hex},
                       json={"channel": "SMS", "tier": "P0", "recipient": "+14155550123",
                             "template_id": "otp", "template_version": otp_template["acme"],
                             "variables": {"code": "123456"}})
        assert r.status_code == 202, r.text

    def p0_of_ours(rows: list[dict[str, Any]]) -> int:
        return sum(row["detail"]["count"] for row in rows
                   if row["action"] == "p0.use" and row["actor"].endswith(f"/{api_pid}"))

    rows = audited(lambda rows: p0_of_ours(rows) >= 3, "--tenant", "acme")
    assert p0_of_ours(rows) == 3
    created = [row for row in rows if row["action"] == "template.create"
               and row["subject"] == f"template:{template_id}@1"]
    assert len(created) == 1
    assert created[0]["actor"] == "token:acme"
    assert created[0]["detail"]["channel"] == "SMS"

    tenants = json.loads(os.environ["NOTIFLOW_TENANTS"])
    for t in tenants:
        if t["id"] == "acme":
            t["rate_limit"] = 1234.5
    changed = json.dumps(tenants)
    first, second = (isolated(f"audit{uuid.uuid4().hex[:6]}", NOTIFLOW_TENANTS=changed)
                     for _ in range(2))
    first.api()
    second.api()
    pids = {iso.processes.procs[-1].proc.pid for iso in (first, second)}

    def policy_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [row for row in rows if row["action"] == "tenant.policy"
                and int(row["actor"].rsplit("/", 1)[1]) in pids]

    rows = audited(lambda rows: bool(policy_rows(rows)), "--action", "tenant.policy")
    hold(SECOND_WRITER_S)
    mine = policy_rows(audit("--action", "tenant.policy"))
    assert len(mine) == 1, mine
    assert mine[0]["tenant"] == "acme" and "rate_limit" in mine[0]["detail"]["changed"]
    assert mine[0]["detail"]["now"]["rate_limit"] == 1234.5
    assert tokens["acme"] not in json.dumps(rows)
