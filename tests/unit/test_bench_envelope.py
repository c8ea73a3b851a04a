"""``notiflow bench envelope`` on a few records: every figure present and plausible, the
report and the chart written."""

from __future__ import annotations

from pathlib import Path

from notiflow.bench.envelope import envelope_markdown, envelope_plot, run


def test_the_envelope_benchmark_reports_cost_and_growth(tmp_path: Path) -> None:
    doc = run(n=40, rounds=2, log=lambda _m: None)
    for mode in ("clear", "sealed"):
        for case in ("dump", "load"):
            low, high = doc["spread_us"][mode][case]
            assert 0 < low <= doc["median_us"][mode][case] <= high
    assert doc["payload_bytes"]["clear"] > 1500
    assert 150 < doc["extra_bytes"] < doc["payload_bytes"]["clear"] / 2
    assert doc["extra_total_us"] == doc["extra_us"]["dump"] + doc["extra_us"]["load"]
    assert "Per message, write and read" in envelope_markdown(doc)
    png = envelope_plot(doc, tmp_path / "envelope.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
