"""Crash and replay: the send flow resumes from Bytewax recovery without loss, and a replayed
ingest record never reaches the provider twice."""

from __future__ import annotations

from collections import Counter

import pytest
from cassandra.cluster import Session

from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.helpers import (
    SUCCESS,
    accepted_counts,
    emulator_records,
    hold,
    produce,
    report,
    statuses,
    wait_for,
)
from tests.integration.test_pipeline import direct, ids_of

pytestmark = pytest.mark.integration

DOWN_S = 1.0
"""How long the killed flow stays down before it restarts."""


def test_restart_mid_stream_loses_nothing(stack: Settings, otp_template: dict[str, int],
                                          start_flow, reconciler, recovery_root, fakes: str,
                                          cql: Session, slow_provider, capsys) -> None:
    recovery = recovery_root / "send-p2-crash"
    flow = start_flow("send", tier=Tier.P2, name="send-p2-crash", recovery=recovery)
    n = 800
    placed = produce(stack, [direct(stack, Tier.P2, otp_template["acme"]) for _ in range(n)])
    ids = ids_of(stack, Tier.P2, placed)
    wanted = set(ids)

    def received() -> int:
        return sum(1 for r in emulator_records(fakes) if r.get("message_id") in wanted)

    wait_for(lambda: received() >= n // 4, what="a quarter of the stream sent")
    flow.kill()
    at_kill = received()
    assert at_kill < n, "the flow finished before it was killed; raise n or latency"
    hold(DOWN_S)
    restarted = start_flow("send", tier=Tier.P2, name="send-p2-crash-restarted",
                           recovery=recovery)

    final = wait_for(lambda: (lambda st: st if set(st.values()) <= SUCCESS else None)(
        statuses(cql, ids)), timeout=180, what="every message provider-accepted after restart")
    assert len(final) == n
    counts = accepted_counts(fakes)
    per_message = Counter(counts.get(i, 0) for i in ids)
    assert per_message[0] == 0, "a message never reached the provider"
    duplicates = sum(c - 1 for c in (counts.get(i, 0) for i in ids) if c > 1)
    report(capsys, f"restart: {n} accepted, {n} PROVIDER_ACCEPTED in Cassandra; emulator had "
          f"{at_kill} before the kill; {duplicates} duplicate sends (in flight at the crash)")
    assert duplicates <= stack.policy(Tier.P2).max_in_flight
    restarted.stop()


def test_replayed_ingest_records_reach_the_provider_once(
        stack: Settings, otp_template: dict[str, int], start_flow, reconciler,
        recovery_root, fakes: str, cql: Session) -> None:
    first = start_flow("send", tier=Tier.P3, name="send-p3-a",
                       recovery=recovery_root / "send-p3-a")
    ids = ids_of(stack, Tier.P3, produce(
        stack, [direct(stack, Tier.P3, otp_template["acme"]) for _ in range(20)]))
    wait_for(lambda: set(statuses(cql, ids).values()) <= SUCCESS, what="all accepted")
    first.stop()

    replay = start_flow("send", tier=Tier.P3, name="send-p3-replay",
                        recovery=recovery_root / "send-p3-replay")

    def replayed() -> bool:
        for mid in ids:
            rows = list(cql.execute("SELECT status FROM message_events WHERE message_id = %s",
                                    (mid,)))
            if sum(r["status"] == "PROVIDER_ACCEPTED" for r in rows) < 2:
                return False
        return True

    wait_for(replayed, what="every record replayed from offset 0")
    counts = accepted_counts(fakes)
    replay.stop()
    assert [counts.get(i, 0) for i in ids] == [1] * len(ids)
