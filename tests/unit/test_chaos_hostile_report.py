"""What `notiflow chaos hostile-tenant` counts as a broken promise (`HostileReport.violations`,
pure): each check fails a report that shows what today's platform was found doing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from notiflow.ops.chaos_hostile import SHORT, HostileReport, markdown
from notiflow.ops.chaos_hostile_attacks import answer_of


def clean(**changes: Any) -> HostileReport:
    report = HostileReport(
        run_id="r1", config={"b_sockets": 10, "inbox_cap": 100}, window_s=20.0,
        b_accepted=311, b_refused=0, b_lost=0, b_wrongly_changed=0,
        b_statuses={"DELIVERED": 311}, p0_p99_ms=180.0, p0_samples=100, p1_p99_ms=900.0,
        p1_samples=200, processes_exited=[],
        a_answers={"status_webhook private": {"422 webhook_url_not_allowed": 13},
                   "template render-bomb": {"201": 1},
                   "batch render-bomb item": {"202": 300},
                   "twilio receipt signed, hint names B": {"200": 30},
                   "forged ingest record claiming B": {"written 60": 1}},
        a_outcomes={"batch render-bomb item": {"FAILED render_error": 300},
                    "own sms": {"DELIVERED": 10}},
        bodies=[{"route": "POST /v1/messages, chunked", "offered": 2**28, "status": "413",
                 "reason": "body_too_large", "bytes_sent": 3_000_000, "seconds": 0.1}],
        inbox={"A 101 opened": 100, "A 429 tenant_connections": 200, "B 101 opened": 10},
        signed_forgeries=30, receipts_dropped_as_forged=30,
        quarantines=["send-p1: PRODUCER_QUARANTINE flow=send.p1 source=producer:hostile-a"],
        dlq_limit_breaches=0, rss_max_mb={"api": 220.0})
    return replace(report, **changes)


def test_a_report_of_a_kept_promise_has_no_violation() -> None:
    assert clean().violations() == []
    assert "| B lost | 0 |" in markdown([clean()])


def test_the_warm_up_is_reported_apart_from_the_window() -> None:
    report = clean(warmup_refused=2, warmup_p0_p99_ms=640.0)
    assert report.violations() == []
    assert "| warm-up: B refused, B P0 p99 (not judged) | 2, 640.0 ms |" in markdown([report])
    assert SHORT.warmup == 0


@pytest.mark.parametrize("changes", [
    {"p0_p99_ms": 501.0},
    {"p0_p99_ms": None},
    {"p1_p99_ms": 10_001.0},
    {"b_lost": 1},
    {"b_wrongly_changed": 1},
    {"processes_exited": ["send-p1"]},
    {"a_answers": {"status_webhook private": {"202": 13}}},
    {"a_answers": {"campaign manifest: B's manifest": {"201": 1}}},
    {"a_answers": {"marketing at P0": {"202": 1}}},
    {"a_answers": {"vonage receipt unsigned": {"200": 10}}},
    {"a_answers": {"template power-10-5000": {"500 internal": 1}}},
    {"a_answers": {"read B's message": {"no answer ReadTimeout": 1}}},
    {"a_outcomes": {"batch render-bomb item": {"DELIVERED": 300}}},
    {"bodies": [{"route": "POST /webhooks/sendgrid", "offered": 2**31, "status": "200",
                 "reason": "", "bytes_sent": 2**31, "seconds": 60.0}]},
    {"bodies": [{"route": "POST /v1/messages", "offered": 2**31, "status": "413",
                 "reason": "", "bytes_sent": 2**30, "seconds": 9.0}]},
    {"inbox": {"A 101 opened": 101, "B 101 opened": 10}},
    {"inbox": {"A 101 opened": 100, "B 429 tenant_connections": 10}},
    {"quarantines": ["send-p1: PRODUCER_QUARANTINE flow=send.p1 source=tenant:acme"]},
    {"dlq_limit_breaches": 1},
], ids=lambda c: next(iter(c)))
def test_each_broken_promise_is_a_violation(changes: dict[str, Any]) -> None:
    assert clean(**changes).violations()


def test_the_short_run_opens_more_inbox_sockets_than_its_cap() -> None:
    assert SHORT.inbox_cap is not None and SHORT.sockets > SHORT.inbox_cap


def test_an_answer_is_its_status_and_reason() -> None:
    import httpx

    assert answer_of(httpx.Response(422, json={"error": "validation_failed",
                                               "reason": "manifest_not_allowed"})) \
        == "422 manifest_not_allowed"
    assert answer_of(httpx.Response(404, json={"error": "not_found"})) == "404 not_found"
    assert answer_of(httpx.Response(202, text="")) == "202"
