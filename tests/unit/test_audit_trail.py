"""The audit trail's pure parts and an API process's auditor against an in-memory log
(notiflow/audit.py, gateway/auditor.py, ops/audit_cli.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import SecretStr

from notiflow.audit import (
    Action,
    AuditEvent,
    changed_fields,
    configuration,
    digest,
    fingerprint,
)
from notiflow.gateway.auditor import Auditor
from notiflow.ops.audit_cli import p0_totals, select
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings, TenantConfig
from tests.fakes import ManualClock
from tests.helpers import wait_until

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
SECRET = "s3cr3t-token-value-0123456789abcdef"


def settings(**tenant: Any) -> Settings:
    acme = {"id": "acme", "token": SECRET, **tenant}
    return Settings(tenants=(TenantConfig.model_validate(acme),),
                    twilio={"account_sid": "AC1", "auth_token": "tw-secret"},
                    dlq_key="k" * 44)


def test_a_fingerprint_tells_secrets_apart_and_reveals_none() -> None:
    a, b = fingerprint(SecretStr(SECRET)), fingerprint(SECRET + "x")
    assert a is not None and a.startswith("sha256:") and len(a) == 19 and a != b
    assert SECRET not in a and fingerprint(None) is None and fingerprint("") is None


def test_configuration_names_each_tenant_and_credential_without_secrets() -> None:
    config = configuration(settings())
    assert set(config) == {"tenant:acme", "credentials:twilio", "credentials:dlq"}
    action, tenant, detail = config["tenant:acme"]
    assert (action, tenant) == (Action.TENANT_POLICY, "acme")
    assert detail["token"] == fingerprint(SECRET)
    assert "tw-secret" not in repr(config) and SECRET not in repr(config)
    assert config["credentials:twilio"][2]["auth_token"] == fingerprint("tw-secret")


def test_a_policy_change_changes_the_digest_and_names_the_fields() -> None:
    before = configuration(settings())["tenant:acme"][2]
    after = configuration(settings(tiers=["P1"], rate_limit=5))["tenant:acme"][2]
    assert digest(before) != digest(after)
    assert digest(before) == digest(configuration(settings())["tenant:acme"][2])
    assert changed_fields(before, after) == ["rate_limit", "tiers"]
    assert changed_fields(None, after) == sorted(after)


class MemoryLog:
    """The AuditLog port in memory; ``fail`` makes appends raise."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []
        self.digests: dict[str, tuple[str, dict[str, Any]]] = {}
        self.fail = False

    async def append(self, event: AuditEvent) -> None:
        if self.fail:
            raise ConnectionError("cassandra down")
        self.events.append(event)

    async def digest(self, subject: str) -> tuple[str, dict[str, Any]] | None:
        return self.digests.get(subject)

    async def swap_digest(self, subject: str, before: str | None, after: str,
                          detail: dict[str, Any], at: datetime) -> bool:
        current = self.digests.get(subject)
        if (current[0] if current else None) != before:
            return False
        self.digests[subject] = (after, detail)
        return True


def configure(auditor: Auditor, log: MemoryLog) -> None:
    async def run() -> None:
        assert await auditor._audit_configuration(log)  # type: ignore[arg-type]
        await auditor.drain()
    auditor.attach(log)  # type: ignore[arg-type]
    asyncio.run(run())


def test_a_configuration_change_is_recorded_once_across_processes() -> None:
    log = MemoryLog()
    configure(Auditor(settings(), ManualClock(T0)), log)
    assert {e.subject for e in log.events} == {"tenant:acme", "credentials:twilio",
                                                "credentials:dlq"}
    assert all(e.detail["first"] for e in log.events)
    log.events.clear()
    configure(Auditor(settings(), ManualClock(T0)), log)
    assert log.events == []
    changed = settings(channels=["SMS"])
    configure(Auditor(changed, ManualClock(T0)), log)
    configure(Auditor(changed, ManualClock(T0)), log)
    (event,) = log.events
    assert (event.action, event.tenant_id) == (Action.TENANT_POLICY, "acme")
    assert event.detail["changed"] == ["channels"] and not event.detail["first"]


def test_p0_use_is_written_per_tenant_and_interval() -> None:
    clock = ManualClock(T0)
    auditor, log = Auditor(settings(), clock), MemoryLog()
    auditor.attach(log)  # type: ignore[arg-type]
    for tenant in ("acme", "acme", "globex"):
        auditor.count_p0(tenant)
    clock.now += timedelta(minutes=1)
    auditor.flush_p0()
    auditor.flush_p0()
    asyncio.run(auditor.drain())
    counts = {e.tenant_id: e.detail["count"] for e in log.events}
    assert counts == {"acme": 2, "globex": 1}
    assert all(e.action == Action.P0_USE for e in log.events)
    assert p0_totals(log.events) == {"acme": 2, "globex": 1}


def test_events_wait_while_cassandra_is_down_and_are_written_after() -> None:
    auditor, log = Auditor(settings(), ManualClock(T0)), MemoryLog()
    event = AuditEvent(T0, Action.TEMPLATE_CREATE, "token:acme", "acme", "template:otp@1")
    auditor.record(event)
    asyncio.run(auditor.drain())
    auditor.attach(log)  # type: ignore[arg-type]
    log.fail = True
    asyncio.run(auditor.drain())
    assert log.events == []
    log.fail = False
    asyncio.run(auditor.drain())
    assert log.events == [event]


def test_concurrent_drains_write_each_event_once() -> None:
    """The run loop's drain and the shutdown's overlap: each event is written once, and an
    event dropped while it was being written takes no other with it."""
    auditor, log = Auditor(settings(), ManualClock(T0)), MemoryLog()
    events = [AuditEvent(T0, Action.TEMPLATE_CREATE, "token:acme", "acme", f"template:t@{i}")
              for i in range(3)]
    slow = log.append

    async def append(event: AuditEvent) -> None:
        await asyncio.sleep(0)
        await slow(event)

    log.append = append  # type: ignore[method-assign]

    async def run() -> None:
        auditor.attach(log)  # type: ignore[arg-type]
        for e in events:
            auditor.record(e)
        await asyncio.gather(auditor.drain(), auditor.drain(), auditor.drain())
    asyncio.run(run())
    assert log.events == events


def test_the_run_loop_writes_what_is_recorded() -> None:
    auditor, log = Auditor(settings(), ManualClock(T0)), MemoryLog()

    async def run() -> None:
        auditor.attach(log)  # type: ignore[arg-type]
        task = asyncio.create_task(auditor.run())
        auditor.record(AuditEvent(T0, Action.TEMPLATE_CREATE, "jwt:svc", "acme", "template:x@1"))
        await wait_until(lambda: any(e.subject == "template:x@1" for e in log.events),
                         timeout=1.0, what="the event written")
        task.cancel()
    asyncio.run(run())
    assert any(e.subject == "template:x@1" for e in log.events)
    assert any(e.action == Action.TENANT_POLICY for e in log.events)


@pytest.mark.parametrize(("tenant", "action", "expected"), [
    (None, None, 4), ("acme", None, 2), (None, "dlq", 2), (None, "dlq.replay", 1),
    ("acme", "p0.use", 1),
])
def test_the_cli_selects_by_tenant_and_action(tenant: str | None, action: str | None,
                                              expected: int) -> None:
    events = [AuditEvent(T0, "p0.use", "api", "acme", "tenant:acme", {"count": 3}),
              AuditEvent(T0, "template.create", "token:acme", "acme", "template:otp@1"),
              AuditEvent(T0, "dlq.replay", "ops", None, "dlq:P1:x"),
              AuditEvent(T0, "dlq.purge", "ops", None, "dlq:P1:y")]
    assert len(select(events, tenant, action)) == expected


def test_tiers_in_the_policy_are_the_configured_ones() -> None:
    detail = configuration(settings(tiers=["P0", "P2"]))["tenant:acme"][2]
    assert detail["tiers"] == [Tier.P0.value, Tier.P2.value]
