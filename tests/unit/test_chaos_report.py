"""The figures of a chaos run (ops/chaos.py ``measure``), from what was accepted, what the
providers accepted and what Cassandra holds."""

from __future__ import annotations

from notiflow.ops.chaos import SCENARIOS, Report, Run, measure, settled, table, totals

T = 1_000_000.0


class NoPhase:
    pass


def run(fault_at: float, undone_at: float) -> Run:
    r = Run(NoPhase(), None)  # type: ignore[arg-type]
    r.fault_at, r.undone_at = fault_at, undone_at
    return r


def test_a_clean_run() -> None:
    p1 = {"a": T, "b": T + 1, "c": T + 20}
    p0 = {"o1": T + 5, "o2": T + 9, "o3": T + 40}
    sends = {"a": [T + 0.5], "b": [T + 14, T + 15], "c": [T + 20.2], "o1": [T + 5.05],
             "o2": [T + 9.4], "o3": [T + 40.1], "other-run": [T]}
    status = dict.fromkeys([*p1, *p0], "DELIVERED")
    report = measure(SCENARIOS["kill-send-p1"], run(T + 4, T + 10), p1, p0, 2, sends, status, 0)
    assert (report.accepted, report.refused, report.terminal, report.failed) == (6, 2, 6, 0)
    assert (report.lost, report.duplicate_sends, report.regressions) == (0, 1, 0)
    assert report.p0_fault_samples == 2 and report.p0_p99_fault_ms == 400.0
    assert report.recovered_after_s == 4.0
    assert report.notes == []


def test_a_lost_message_and_an_undelivered_otp_are_counted() -> None:
    p1, p0 = {"a": T, "b": T + 1, "c": T + 2}, {"o1": T + 5}
    status = {"a": "DELIVERED", "b": "PROCESSING", "c": "FAILED", "o1": None}
    report = measure(SCENARIOS["provider-outage"], run(T + 4, T + 10), p1, p0, 0,
                     {"a": [T + 1]}, status, 1)
    assert (report.terminal, report.failed, report.lost, report.regressions) == (2, 1, 2, 1)
    assert report.recovered_after_s is None and report.p0_p99_fault_ms is None
    assert report.notes == ["1 P0 of the fault window never reached a provider"]
    assert totals([report]) == {"lost": 2, "regressions": 1, "lost_webhooks": 0}
    assert ("| provider-outage | 4 | 0 | 2 | 1 | 2 | 0 | 1 | — | not recovered |"
            in table([report]))


def test_a_sent_message_whose_status_was_never_announced_is_a_lost_webhook() -> None:
    """``b`` is DELIVERED but only its PROVIDER_ACCEPTED was announced; ``c`` was never sent
    and P0 asks for no webhooks."""
    p1, p0 = {"a": T, "b": T + 1, "c": T + 2}, {"o1": T + 5}
    status = dict.fromkeys([*p1, *p0], "DELIVERED") | {"c": "FAILED"}
    sends = {"a": [T + 1], "b": [T + 2], "o1": [T + 5.1]}
    announced = {"a": {"PROVIDER_ACCEPTED", "DELIVERED"}, "b": {"PROVIDER_ACCEPTED"},
                 "o1": set()}
    report = measure(SCENARIOS["kill-webhooks"], run(T + 4, T + 10), p1, p0, 0, sends,
                     status, 0, announced=announced)
    assert (report.lost, report.lost_webhooks) == (0, 1)
    assert totals([report])["lost_webhooks"] == 1
    assert "| kill-webhooks | 4 | 0 | 4 | 1 | 0 (webhooks 1) |" in table([report])
    assert measure(SCENARIOS["kill-send-p1"], run(T + 4, T + 10), p1, p0, 0, sends,
                   status, 0).lost_webhooks is None


def test_a_failed_message_does_not_hold_up_recovery() -> None:
    p1 = {"a": T, "c": T + 2}
    status = {"a": "DELIVERED", "c": "FAILED"}
    report = measure(SCENARIOS["provider-outage"], run(T + 4, T + 10), p1, {}, 0,
                     {"a": [T + 11]}, status, 0)
    assert (report.failed, report.lost, report.recovered_after_s) == (1, 0, 1.0)


def test_every_scenario_can_be_undone() -> None:
    assert len(SCENARIOS) >= 10
    for s in SCENARIOS.values():
        assert callable(s.inject) and callable(s.undo) and s.hold > 0 and s.what
    assert isinstance(Report.__dataclass_fields__, dict)


def test_every_process_kind_and_store_has_its_faults() -> None:
    """The fault list: each process kind SIGKILLed, each store killed or paused and reached
    through a proxy (latency and a partition)."""
    kinds = ("api", "api-bulk", "send-p0", "send-p1", "send-p2", "send-p3", "reconciler",
             "webhooks", "scheduler", "expander")
    stores = ("redis-kill", "kafka-restart", "cassandra-pause", "cassandra-restart",
              *(f"{s}-{f}" for s in ("redis", "kafka", "cassandra")
                for f in ("latency", "partition")))
    missing = ({f"kill-{k}" for k in kinds} | set(stores)) - set(SCENARIOS)
    assert not missing, sorted(missing)


def test_a_run_settles_when_every_message_is_sent_or_terminal() -> None:
    assert settled(["a", "b"], {"a": [T]}, {"a": "PROCESSING", "b": "EXPIRED"})
    assert not settled(["a", "b"], {"a": [T]}, {"b": "RETRY_PENDING"})
    sent_not_recorded = {"a": "PROCESSING", "b": "EXPIRED"}
    assert settled(["a", "b"], {"a": [T]}, sent_not_recorded)
    assert not settled(["a", "b"], {"a": [T]}, sent_not_recorded, recorded=True)
    assert settled(["a", "b"], {"a": [T]}, {"a": "DELIVERED", "b": "EXPIRED"}, recorded=True)
