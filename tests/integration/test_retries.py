"""Retries on the real stack with the SMS emulators (Twilio, Vonage): a transient burst is
retried until the provider accepts; every vendor down ends EXPIRED at the TTL, never FAILED
after a spent budget; a SIGKILL with retries pending loses none of them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.ops.procs import ManagedProcess
from notiflow.schemas.enums import Tier
from tests.helpers import (
    SMS_PROVIDERS,
    SUCCESS,
    accepted_counts,
    emulator_records,
    hold,
    produce,
    report,
    statuses,
    wait_for,
)
from tests.integration.conftest import Isolated
from tests.integration.test_pipeline import direct, ids_of

pytestmark = pytest.mark.integration

DOWN_S = 1.0
"""How long the killed flow stays down before it restarts."""


def configure(fakes: str, **knobs: object) -> None:
    for provider in SMS_PROVIDERS:
        httpx.post(f"{fakes}/_admin/{provider}/config", json=knobs).raise_for_status()


@pytest.fixture
def healthy_afterwards(fakes: str) -> Iterator[None]:
    yield
    configure(fakes, error_rate_5xx=0.0, statuses_5xx=[500, 503], outage=False)


def namespace(isolated, name: str) -> tuple[Isolated, ManagedProcess]:
    iso = isolated(name)
    rec = iso.start("reconcile", ["flow", "reconcile", "--recovery-dir",
                                  str(iso.recovery / "reconcile")])
    rec.wait_until(lambda: "starting" in rec.log_path.read_text(errors="replace"))
    return iso, iso.flow(Tier.P1)


def attempts(cql: Session, mid: str) -> list[dict]:
    return list(cql.execute("SELECT attempt_no, provider_id, outcome FROM attempts "
                            "WHERE message_id = %s", (mid,)))


def event_statuses(cql: Session, mid: str) -> list[str]:
    return [r["status"] for r in cql.execute(
        "SELECT status FROM message_events WHERE message_id = %s", (mid,))]


def failures_per_message(fakes: str, ids: list[str]) -> dict[str, int]:
    wanted = set(ids)
    out = dict.fromkeys(ids, 0)
    for r in emulator_records(fakes):
        if r.get("message_id") in wanted and r.get("outcome") != "accepted":
            out[r["message_id"]] += 1
    return out


def test_transient_burst_is_retried_until_accepted(isolated, otp_template: dict[str, int],
                                                   fakes: str, cql: Session,
                                                   healthy_afterwards: None, capsys) -> None:
    iso, _ = namespace(isolated, "burst")
    configure(fakes, error_rate_5xx=1.0, statuses_5xx=[503])
    placed = produce(iso.settings, [direct(iso.settings, Tier.P1, otp_template["acme"])
                                    for _ in range(4)])
    ids = ids_of(iso.settings, Tier.P1, placed)
    wait_for(lambda: all(n >= 2 for n in failures_per_message(fakes, ids).values()),
             timeout=60, what="two failed attempts per message")
    configure(fakes, error_rate_5xx=0.0)
    final = wait_for(lambda: (lambda st: st if set(st.values()) <= SUCCESS else None)(
        statuses(cql, ids)), timeout=90, what="every message provider-accepted")
    counts = accepted_counts(fakes)
    assert all(counts.get(mid) == 1 for mid in ids), counts
    tried = {}
    for mid in ids:
        rows = wait_for(lambda m=mid: (lambda a: a if a and a[-1]["outcome"] == "accepted"
                                       else None)(attempts(cql, m)),
                        what="attempts recorded")
        assert [r["outcome"] for r in rows[:2]] == ["transient", "transient"]
        assert "RETRY_PENDING" in event_statuses(cql, mid)
        tried[mid] = len(rows)
    report(capsys, f"transient burst: {len(final)} messages accepted after "
           f"{sorted(tried.values())} attempts each")


def test_every_vendor_down_ends_expired_at_the_ttl(isolated, otp_template: dict[str, int],
                                                   fakes: str, cql: Session,
                                                   healthy_afterwards: None, capsys) -> None:
    iso, _ = namespace(isolated, "alldown")
    configure(fakes, outage=True)
    ttl = timedelta(seconds=5)
    expires = (datetime.now(UTC) + ttl).isoformat()
    placed = produce(iso.settings, [
        direct(iso.settings, Tier.P1, otp_template["acme"], expires_at=expires)
        for _ in range(20)])
    ids = ids_of(iso.settings, Tier.P1, placed)
    final = wait_for(lambda: (lambda st: st if None not in st.values() and set(st.values())
                              <= {"EXPIRED", "FAILED"} else None)(statuses(cql, ids)),
                     timeout=90, what="every message ended")
    assert set(final.values()) == {"EXPIRED"}, final
    max_attempts = iso.settings.policy(Tier.P1).retry.attempts
    spent = [len(attempts(cql, mid)) for mid in ids]
    assert max(spent) < max_attempts
    assert accepted_counts(fakes).keys().isdisjoint(ids)
    report(capsys, f"all vendors down: {len(ids)} EXPIRED at a {ttl.seconds} s TTL after "
           f"{sum(spent)} attempts in all (at most {max(spent)} per message; budget "
           f"{max_attempts})")


def test_sigkill_with_retries_pending_loses_none(isolated, otp_template: dict[str, int],
                                                 fakes: str, cql: Session,
                                                 healthy_afterwards: None, capsys) -> None:
    iso, flow = namespace(isolated, "killretry")
    configure(fakes, error_rate_5xx=1.0, statuses_5xx=[503])
    n = 30
    placed = produce(iso.settings, [direct(iso.settings, Tier.P1, otp_template["acme"])
                                    for _ in range(n)])
    ids = ids_of(iso.settings, Tier.P1, placed)
    wait_for(lambda: set(statuses(cql, ids).values()) == {"RETRY_PENDING"}, timeout=60,
             what="every message waiting for a retry")
    flow.kill()
    configure(fakes, error_rate_5xx=0.0)
    hold(DOWN_S)
    iso.flow(Tier.P1)
    final = wait_for(lambda: (lambda st: st if set(st.values()) <= SUCCESS else None)(
        statuses(cql, ids)), timeout=120, what="every message accepted after the restart")
    assert len(final) == n
    counts = accepted_counts(fakes)
    assert all(counts.get(mid, 0) >= 1 for mid in ids)
    duplicates = sum(counts[mid] - 1 for mid in ids)
    report(capsys, f"SIGKILL with {n} retries pending: {n}/{n} provider-accepted after the "
           f"restart, {duplicates} duplicate sends")
    assert duplicates == 0, "nothing was in flight at the kill: no attempt may repeat"
