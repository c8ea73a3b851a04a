"""The benchmark harness's pure parts: the workload, the statistics, the profile summary and
the report files."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.bench.report import (
    isolation_markdown,
    isolation_plot,
    scale_markdown,
    soak_markdown,
    throughput_markdown,
)
from notiflow.bench.stats import percentile, profile_top, steady_rate, summary
from notiflow.bench.warmup import WARM_PHONES
from notiflow.bench.workload import (
    CHANNEL_MIX,
    RECORD_BYTES,
    REGIONS,
    PhoneFactory,
    Workload,
    awake,
    records,
)
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import IngestRecord

NOON_UTC = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_workload_mix_size_and_validity() -> None:
    w = Workload("t1", now=NOON_UTC)
    got = list(records(w, Tier.P3, 4000))
    mix = Counter(g.channel for g in got)
    for channel, share in CHANNEL_MIX:
        assert abs(mix[channel] / len(got) - share) < 0.03, (channel, mix)
    assert all(RECORD_BYTES - 8 <= len(g.value) <= RECORD_BYTES + 8 for g in got)
    recipients = set()
    for g in got[:1500]:
        rec = IngestRecord.model_validate_json(g.value)
        assert rec.tier is Tier.P3 and rec.message_id == g.message_id
        assert rec.message_id.startswith(w.prefix)
        key = rec.recipient if isinstance(rec.recipient, str) else rec.recipient.device_token
        recipients.add(key)
        if rec.channel is Channel.SMS:
            assert awake(rec.recipient, NOON_UTC)
    assert len(recipients) == 1500


def test_push_tokens_never_hit_an_emulator_error_prefix() -> None:
    """A benchmark message must not fail by chance: no generated token starts with a prefix
    the APNs emulator answers with an error (1 in ~13,000 random hex tokens would)."""
    from notiflow.providers.apns.emulator import MAGIC_TOKENS

    w = Workload("tok")
    tokens = [w.recipient(Channel.PUSH)[0] for _ in range(60_000)]
    ios = [t["device_token"] for t in tokens if isinstance(t, dict) and t["platform"] == "ios"]
    assert len(ios) == 15_000
    assert not [t for t in ios if t.startswith(tuple(MAGIC_TOKENS)) or set(t) == {"0"}]


def test_phone_factories_with_distinct_starts_never_meet() -> None:
    a = PhoneFactory(REGIONS, NOON_UTC)
    b = PhoneFactory(REGIONS, NOON_UTC, start=500_000)
    assert not {a.take() for _ in range(300)} & {b.take() for _ in range(300)}


def test_the_flood_and_the_warm_up_have_different_sms_recipients() -> None:
    def phones(w: Workload) -> set[str]:
        return {str(w.recipient(Channel.SMS)[0]) for _ in range(300)}

    flood, warm = Workload("run", now=NOON_UTC), Workload("warm", now=NOON_UTC,
                                                          phone_start=WARM_PHONES)
    assert not phones(flood) & phones(warm)
    assert phones(Workload("a", now=NOON_UTC)) == phones(Workload("b", now=NOON_UTC))


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200),
       st.floats(0.5, 100))
def test_percentile_is_an_element_with_enough_below(values: list[float], p: float) -> None:
    got = percentile(values, p)
    assert got in values
    assert sum(v <= got for v in values) >= p / 100 * len(values)


def test_summary_and_steady_rate() -> None:
    assert summary([]) == {"n": 0, "p50": None, "p99": None, "max": None}
    s = summary([float(i) for i in range(1, 101)])
    assert (s["n"], s["p50"], s["p99"], s["max"]) == (100, 50.0, 99.0, 100.0)
    times = [i / 100 for i in range(1001)]  # 100/s for 10 s
    assert steady_rate(times) == pytest.approx(100, rel=0.01)
    assert steady_rate([1.0, 2.0]) is None


def test_profile_charges_each_sample_to_its_innermost_project_step() -> None:
    collapsed = "\n".join([
        "<module> (notiflow/cli.py:1);run_flow (flows/runner.py:9);"
        "SendLogic.on_batch (flows/dispatch.py:5);send (aiohttp/client.py:3) 30",
        "<module> (notiflow/cli.py:1);run_flow (flows/runner.py:9);"
        "build_message (notiflow/providers/smtp.py:7);as_bytes (email/message.py:2) 50",
        "<module> (notiflow/cli.py:1);run_flow (flows/runner.py:9) 20",
    ])
    top = profile_top(collapsed)
    assert top["stages"][0] == ("build_message (providers/smtp.py)", 0.5)
    assert ("SendLogic.on_batch (flows/dispatch.py)", 0.3) in top["stages"]
    assert top["self"][0] == ("as_bytes (email/message.py)", 0.5)
    assert profile_top("") == {"self": [], "stages": [], "samples": []}


def _iso_mode(mode: str, p0_p99: float) -> dict[str, object]:
    return {"mode": mode, "n": 10, "otp_rate": 5, "drained": True, "wall_s": 3.0,
            "produce_rate": 1000,
            "p0": {"n": 3, "p50": 20.0, "p99": p0_p99, "max": p0_p99, "sent": 3, "refused": 0,
                   "missing": 0},
            "p3": {"n": 10, "p50": 900.0, "p99": 2000.0, "max": 2100.0, "missing": 0,
                   "drain_s": 2.0, "drain_rate": 5},
            "timeline": {"p0": [(0.1, 20.0), (0.5, p0_p99)], "p3": [(0.2, 900.0)]},
            "processes": {"send-p0": {"cpu_s": 1.0, "rss_start_mb": 100.0,
                                      "rss_end_mb": 101.0, "rss_max_mb": 102.0}}}


def test_reports_render(tmp_path: Path) -> None:
    doc = {"modes": {"tiered": _iso_mode("tiered", 40.0), "shared": _iso_mode("shared", 4000.0)},
           "p0_p99_ratio_shared_over_tiered": 100.0}
    md = isolation_markdown(doc)
    assert "| tiered |" in md and "| shared |" in md and "100.0x" in md
    png = isolation_plot(doc, tmp_path / "iso.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    unrecorded = {"modes": {"tiered": {**_iso_mode("tiered", 40.0), "budget_recorded": False}}}
    assert "not recorded (`--no-budget`" in isolation_markdown(unrecorded)
    pipe = {"n": 10, "rate": 100.0, "steady_rate": 110.0, "cpu_ms_per_msg": 1.0,
            "cpu_by_process": {"x": 1.0}}
    tp = throughput_markdown({"e2e": {**pipe, "procs": {}}, "minimal": pipe,
                              "passthrough": pipe, "ratio_minimal": 1.0,
                              "ratio_passthrough": 1.0, "profile": {}})
    assert "100%" in tp
    sc = scale_markdown({"runs": [{"processes": 1, "steady_rate": 100.0, "rate": 90.0,
                                   "cpu_ms_per_msg": 1.0},
                                  {"processes": 2, "steady_rate": 150.0, "rate": 120.0,
                                   "cpu_ms_per_msg": 1.1}]})
    assert "1.50x" in sc


def test_soak_report_and_settings() -> None:
    import json
    from datetime import timedelta

    from notiflow.bench.isolation import soak_env
    from notiflow.settings import Settings

    proc = {"cpu_s": 1.0, "rss_start_mb": 100.0, "rss_mid_mb": 110.0, "rss_end_mb": 111.5,
            "rss_max_mb": 112.0, "rss_tenths_mb": [100.0 + i for i in range(11)]}
    lat = {"n": 5, "p50": 0.1, "p99": 0.2, "max": 0.3}
    md = soak_markdown({"minutes": 10, "p3_rate": 40, "cap_window_s": 60.0, "modes": {"soak": {
        "otp_rate": 20, "n": 5, "p0": lat, "p3": lat, "processes": {"send-p0": proc}}}})
    assert "| send-p0 | 100.0 | 110.0 | 111.5 | +1.5 | 112.0 | 1.0 |" in md
    assert "| send-p0 | 100.0 101.0 102.0" in md and "60.0 s windows" in md
    caps = json.loads(soak_env(Settings(), timedelta(seconds=60))["NOTIFLOW_CAPS"])
    limits = {c.value: r.limit for c, r in Settings().caps.items()}
    assert caps == {c: {"limit": n, "window": 60.0} for c, n in limits.items()}


def test_topic_specs_are_unique_in_either_mode() -> None:
    from notiflow.ops.topics import topic_specs
    from notiflow.settings import Settings

    tiered = {s.name for s in topic_specs(Settings())}
    shared = [s.name for s in topic_specs(Settings(mode="shared"))]
    assert len(shared) == len(set(shared))
    assert set(shared) == tiered
