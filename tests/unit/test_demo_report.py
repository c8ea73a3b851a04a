"""Pure parts of ``notiflow demo``: the warm-up stop rule, the warm-up line, the report's
heading, rows and cells, and the lines that let a newcomer call the API it leaves running
(no stack)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from notiflow.ops.demo_report import (
    REPORT_COLUMNS,
    WARMUP_BOUND,
    Sent,
    TierRow,
    Verdict,
    WarmUp,
    Wave,
    format_sla,
    quantile,
    report,
    report_heading,
    row_cells,
    tier_rows,
    try_it,
    warmup_summary,
    warmup_verdict,
)
from notiflow.schemas.enums import Status, Tier
from notiflow.settings import DEFAULT_TIERS

SLA_MS = 1000.0
SLAS = {tier: policy.sla for tier, policy in DEFAULT_TIERS.items()}
T0 = datetime(2025, 1, 1, 12, tzinfo=UTC)


def wave(p50: float | None, p99: float | None, seconds: float = 6.0) -> Wave:
    return Wave(requests=100, seconds=seconds, p50=p50, p99=p99)


@pytest.mark.parametrize(("waves", "elapsed", "expected"), [
    ([], 0.0, Verdict.GO_ON),
    ([wave(70, 200)], 6.0, Verdict.GO_ON),
    ([wave(500, 1800), wave(120, 400)], 12.0, Verdict.GO_ON),
    ([wave(120, 400), wave(100, 300)], 12.0, Verdict.SETTLED),
    ([wave(100, 300), wave(120, 300)], 12.0, Verdict.SETTLED),
    ([wave(100, 300), wave(121, 300)], 12.0, Verdict.GO_ON),
    ([wave(100, 300), wave(79, 300)], 12.0, Verdict.GO_ON),
    ([wave(100, 900), wave(100, 1000)], 12.0, Verdict.GO_ON),
    ([wave(100, 300), wave(None, None)], 12.0, Verdict.GO_ON),
    ([wave(None, None), wave(100, 300)], 12.0, Verdict.GO_ON),
    ([wave(500, 1800), wave(120, 1400)], 54.0, Verdict.GO_ON),
    ([wave(500, 1800), wave(120, 1400)], 54.1, Verdict.BOUND),
    ([wave(500, 1800), wave(120, 1400)], 70.0, Verdict.BOUND),
    ([wave(120, 400), wave(100, 300)], 70.0, Verdict.SETTLED),
    ([], 60.5, Verdict.BOUND),
])
def test_stop_rule(waves: list[Wave], elapsed: float, expected: Verdict) -> None:
    """Settled needs two waves whose P0 p50s are within 20 % and a last p99 under the SLA;
    otherwise the bound stops a wave that would end after 60 s of warm-up."""
    assert warmup_verdict(waves, elapsed, sla_ms=SLA_MS, bound=60.0, tolerance=0.2) is expected


def test_stop_rule_defaults() -> None:
    assert warmup_verdict([], WARMUP_BOUND + 0.1, sla_ms=SLA_MS) is Verdict.BOUND
    assert warmup_verdict([wave(100, 300), wave(110, 300)], 12.0, sla_ms=SLA_MS) \
        is Verdict.SETTLED
    assert warmup_verdict([wave(100, 300), wave(130, 300)], 12.0, sla_ms=SLA_MS) \
        is Verdict.GO_ON


def test_quantile() -> None:
    assert quantile([], 99) is None
    assert quantile([42.0], 50) == 42.0
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 50) == pytest.approx(50.5)
    assert quantile(values, 99) == pytest.approx(99.01)


@pytest.mark.parametrize(("sla", "text"), [
    (timedelta(seconds=1), "< 1 s"),
    (timedelta(seconds=10), "< 10 s"),
    (timedelta(minutes=5), "< 5 min"),
    (timedelta(hours=1), "< 1 h"),
    (timedelta(seconds=90), "< 90 s"),
    (timedelta(milliseconds=500), "< 0.5 s"),
])
def test_format_sla(sla: timedelta, text: str) -> None:
    assert format_sla(sla) == text


def test_sla_targets_come_from_the_settings() -> None:
    assert [format_sla(SLAS[t]) for t in Tier] == ["< 1 s", "< 10 s", "< 5 min", "< 1 h"]


def _sent(tier: Tier, n: int) -> list[Sent]:
    return [Sent(f"{tier.value}-{i}", tier, T0) for i in range(n)]


def test_tier_rows_counts_latencies_and_sla() -> None:
    p0, p1, p3 = _sent(Tier.P0, 4), _sent(Tier.P1, 3), _sent(Tier.P3, 2)
    rows = {
        "P0-0": Status.PROVIDER_ACCEPTED, "P0-1": Status.DELIVERED,
        "P0-2": Status.FAILED, "P0-3": Status.QUEUED,
        "P1-0": Status.SENT, "P1-1": Status.SUPPRESSED,
        "P1-2": Status.EXPIRED,
        "P3-0": Status.PROVIDER_ACCEPTED,
    }
    latency = {"P0-0": 40.0, "P0-1": 1200.0, "P1-0": 300.0, "P3-0": 5000.0}
    by_tier = {r.tier: r for r in tier_rows([*p0, *p1, *p3], rows, latency, SLAS)}

    assert list(by_tier) == list(Tier)
    r0 = by_tier[Tier.P0]
    assert (r0.accepted, r0.provider_accepted, r0.failed, r0.expired_suppressed,
            r0.not_terminal) == (4, 2, 1, 0, 1)
    assert r0.max == 1200.0 and r0.p50 == pytest.approx(620.0)
    assert r0.p99 is not None and r0.p99 > 1000 and r0.meets_sla is False
    r1 = by_tier[Tier.P1]
    assert (r1.provider_accepted, r1.expired_suppressed, r1.not_terminal) == (1, 2, 0)
    assert r1.meets_sla is True and r1.sla == timedelta(seconds=10)
    r2 = by_tier[Tier.P2]
    assert (r2.accepted, r2.p99, r2.meets_sla) == (0, None, None)
    r3 = by_tier[Tier.P3]
    assert (r3.not_terminal, r3.meets_sla) == (1, True)


def test_p99_equal_to_the_sla_does_not_meet_it() -> None:
    row = TierRow(Tier.P0, timedelta(seconds=1), 1, 1, 0, 0, 0, 1000.0, 1000.0, 1000.0)
    assert row.meets_sla is False


def test_row_cells_follow_the_columns() -> None:
    row = TierRow(Tier.P0, timedelta(seconds=1), 100, 97, 3, 0, 0, 61.4, 1253.2, 1301.0)
    cells = row_cells(row)
    assert len(cells) == len(REPORT_COLUMNS)
    assert dict(zip(REPORT_COLUMNS, cells, strict=True)) == {
        "tier": "P0", "SLA\n(p99)": "< 1 s", "accepted": "100", "provider\naccepted": "97",
        "failed": "3", "expired or\nsuppressed": "0", "not\nterminal": "0", "p50\nms": "61",
        "p99\nms": "1,253", "max\nms": "1,301", "meets\nSLA": "no"}
    empty = TierRow(Tier.P2, timedelta(minutes=5), 0, 0, 0, 0, 0, None, None, None)
    assert row_cells(empty)[-4:] == ["-", "-", "-", "-"]


def test_heading_says_what_was_measured() -> None:
    text = report_heading(requests=400, seconds=20.0, warm_requests=404, warm_seconds=31.4,
                          cores=2, load=3.14)
    assert text.splitlines() == [
        "measured run of 400 messages at 5.0 msg/s per tier (20.0 msg/s through the API), "
        "after a warm-up of 404 messages / 31 s",
        "latency = emulator receipt time - accepted_at; one machine (2 cores, 1-min load "
        "average 3.1 at the start), one clock"]
    assert report_heading(requests=0, seconds=0.0, warm_requests=4, warm_seconds=1.0,
                          cores=8).endswith("one machine (8 cores), one clock")


def test_warmup_summary_settled_and_bound() -> None:
    warm = WarmUp(requests=304, seconds=24.6, verdict=Verdict.SETTLED,
                  waves=[wave(812, 1900), wave(96, 300), wave(88, 210)])
    assert warmup_summary(warm, sla=timedelta(seconds=1)) == (
        "warm-up, not reported: 304 messages / 25 s; P0 p50/p99 ms by wave: "
        "812/1,900 → 96/300 → 88/210; settled (p50 ±20%, p99 < 1 s)")
    bound = WarmUp(requests=904, seconds=63.0, verdict=Verdict.BOUND,
                   waves=[wave(900, 2500), wave(None, None)], rejected=Counter({"429 x": 2}))
    line = warmup_summary(bound, sla=timedelta(seconds=1), bound=60.0)
    assert "(2 rejected)" in line and "900/2,500 → -/-" in line
    assert line.endswith("60 s bound reached, P0 latency not settled")
    assert "\n" not in line


def test_report_prints_heading_and_every_tier() -> None:
    console = Console(width=160, record=True, color_system=None)
    rows = tier_rows(_sent(Tier.P0, 1), {"P0-0": Status.PROVIDER_ACCEPTED},
                     {"P0-0": 80.0}, SLAS)
    report(console, "measured run of 1 messages", rows)
    text = console.export_text()
    assert text.startswith("measured run of 1 messages")
    for column in ("SLA", "(p99)", "meets", "< 1 s", "< 1 h", "yes"):
        assert column in text


def test_the_try_it_lines_give_every_token_and_a_request_the_api_accepts() -> None:
    import json
    import shlex

    from notiflow.schemas.messages import SendRequest

    tokens = {"acme": "nf_acme_x", "globex": "nf_globex_y", "mkt": "nf_mkt_z"}
    lines = try_it("http://127.0.0.1:18080", tokens, 3, "+14155552671")
    assert all(any(f"{t}: {tok}" in line for line in lines) for t, tok in tokens.items())
    curl = next(line for line in lines if line.strip().startswith("curl -sS -X POST"))
    args = shlex.split(curl)
    headers = [args[i + 1] for i, a in enumerate(args) if a == "-H"]
    assert "Authorization: Bearer nf_acme_x" in headers
    assert any(h.startswith("Idempotency-Key: ") for h in headers)
    assert args[args.index("-X") + 2] == "http://127.0.0.1:18080/v1/messages"
    req = SendRequest.model_validate(json.loads(args[args.index("-d") + 1]))
    assert (req.template_id, req.template_version, req.recipient) == (
        "demo-code", 3, "+14155552671")
