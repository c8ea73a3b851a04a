"""The history archive's rows and files, and the report's ClickHouse SQL run by chDB over
them: a synthetic (day, tenant) with known latencies, refusals, failure receipts and a
campaign, whose sections are checked against figures computed here."""

from __future__ import annotations

import asyncio
import hashlib
import statistics
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from notiflow import archive
from notiflow.correlation import CorrelationKeys
from notiflow.ops import report
from notiflow.schemas.campaigns import row_message_id

DAY = date(2026, 11, 20)
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
CAMPAIGN = "cmp_" + "4" * 32
KEYS = CorrelationKeys((b"a" * 32,))


def ms(n: float) -> datetime:
    return T0 + timedelta(milliseconds=n)


def message(mid: str, *, channel: str = "SMS", tier: str = "P1", masked: str = "+4179*****67",
            status: str = "DELIVERED", provider: str = "twilio",
            tenant: str = "acme") -> dict[str, Any]:
    return {"message_id": mid, "tenant_id": tenant, "channel": channel, "tier": tier,
            "category": "transactional", "recipient_hash": "h" * 32, "recipient_masked": masked,
            "template_id": "otp", "template_version": 1, "status": status, "reason": None,
            "attempt": 1, "provider_id": provider, "accepted_at": T0.replace(tzinfo=None),
            "created_at": T0, "updated_at": ms(5000)}


def event(status: str, at: float, source: str = "send", event_id: str = "e",
          reason: str | None = None) -> dict[str, Any]:
    return {"status": status, "occurred_at": ms(at).replace(tzinfo=None), "event_id": event_id,
            "attempt": 1, "reason": reason, "source": source, "applied": True}


def attempt(provider: str, outcome: str = "accepted", no: int = 1,
            error_code: str | None = None) -> dict[str, Any]:
    return {"attempt_no": no, "provider_id": provider, "provider_message_id": f"pm-{no}",
            "outcome": outcome, "normalized_error": None if outcome == "accepted" else "x",
            "error_code": error_code, "started_at": T0, "completed_at": ms(10)}


def day_rows() -> archive.DayRows:
    messages, events, attempts = [], {}, {}
    for i in range(100):
        mid = f"msg_tw{i}"
        messages.append(message(mid))
        events[mid] = [event("QUEUED", 0), event("PROVIDER_ACCEPTED", 50),
                       event("DELIVERED", i + 1, "receipt.twilio", f"twilio:SM{i}:delivered")]
        attempts[mid] = [attempt("twilio")]
    for i in range(10):
        mid = f"msg_vo{i}"
        failed = i < 2
        messages.append(message(mid, masked="+1415****71", provider="vonage",
                                status="FAILED" if failed else "DELIVERED", tier="P3"))
        events[mid] = [event("PROVIDER_ACCEPTED", 100),
                       event("FAILED", 2000, "receipt.vonage", f"vonage:{i}:failed", "4")
                       if failed else event("DELIVERED", 1000, "receipt.vonage", f"vonage:{i}")]
        attempts[mid] = ([attempt("twilio", "transient", 1, "http_503")] if i < 3 else []) + [
            attempt("vonage", no=2)]
    for row in range(1, 6):
        mid = row_message_id(KEYS, CAMPAIGN, row)
        messages.append(message(mid, channel="EMAIL", masked="a***@example.com",
                                provider="sendgrid", tier="P3",
                                status="SUPPRESSED" if row == 5 else "CLICKED"))
        events[mid] = [] if row == 5 else [
            event("PROVIDER_ACCEPTED", 10), event("DELIVERED", 20, "receipt.sendgrid", "sg:d"),
            event("OPENED", 30, "receipt.sendgrid", "sg:o")] + (
            [event("CLICKED", 40, "receipt.sendgrid", "sg:c")] if row <= 2 else [])
        attempts[mid] = [] if row == 5 else [attempt("sendgrid")]
    messages.append(message("msg_other", tenant="mkt"))
    return archive.DayRows(DAY, "acme", messages, events, attempts)


def test_records_derive_country_campaign_and_first_times() -> None:
    recs = archive.records(day_rows(), KEYS)
    by_id = {r["message_id"]: r for r in recs["messages"]}
    assert "msg_other" not in by_id and len(by_id) == 115
    tw = by_id["msg_tw9"]
    assert (tw["country"], tw["campaign_id"], tw["provider_id"]) == ("CH", None, "twilio")
    assert tw["delivered_at"] - tw["accepted_at"] == timedelta(milliseconds=10)
    assert tw["accepted_at"].tzinfo is not None
    assert by_id["msg_vo0"]["country"] == "US" and by_id["msg_vo0"]["failed_at"] == ms(2000)
    assert by_id["msg_vo0"]["attempts"] == 2
    mail = by_id[row_message_id(KEYS, CAMPAIGN, 1)]
    assert (mail["campaign_id"], mail["country"], mail["clicked_at"]) == (CAMPAIGN, None, ms(40))
    assert "recipient_masked" not in mail and all(
        "@" not in str(v) and "*" not in str(v) for v in mail.values())
    receipt = next(r for r in recs["receipts"] if r["message_id"] == "msg_vo0")
    assert (receipt["provider_id"], receipt["provider_event_id"], receipt["error_code"]) == (
        "vonage", "0:failed", "4")
    assert len(recs["events"]) == 300 + 20 + 4 * 3 + 2
    assert len(recs["attempts"]) == 100 + 13 + 4


@pytest.mark.parametrize("masked,country", [("+4179*****67", "CH"), ("+1415****71", "US"),
                                            ("+44791****00", "GB"), ("+8869****12", "TW"),
                                            ("+999*****1", None), (None, None)])
def test_country_of_the_calling_code(masked: str | None, country: str | None) -> None:
    assert archive.country_of("SMS", masked) == country
    assert archive.country_of("EMAIL", masked) is None


def test_due_days_stay_inside_the_ttl() -> None:
    days = archive.due_days(date(2026, 12, 6), timedelta(days=30), timedelta(days=2))
    assert (days[0], days[-1], len(days)) == (date(2026, 11, 7), date(2026, 12, 4), 28)


def encoded(f: archive.DatasetFile) -> bytes:
    f.finish()
    data = b"".join(f.chunks())
    f.close()
    return data


def test_files_read_back_and_the_manifest_names_them(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "SPILL_BYTES", 4096)
    monkeypatch.setattr(archive, "CHUNK_BYTES", 1000)
    recs = archive.records(day_rows(), KEYS)
    files = {}
    for name in archive.DATASETS:
        f = archive.DatasetFile(name)
        f.add(recs[name][:50])
        f.add(recs[name][50:])
        f.finish()
        data = b"".join(f.chunks())
        assert len(data) == f.size and hashlib.sha256(data).hexdigest() == f.sha256
        path = tmp_path / name
        path.write_bytes(data)
        table = pq.read_table(path)
        assert table.schema.equals(archive.schemas()[name])
        assert table.num_rows == f.rows == len(recs[name])
        assert pq.ParquetFile(path).num_row_groups == 2
        files[name] = (archive.data_key(name, DAY, "acme"), f)
    assert pq.read_table(pa_buffer(encoded(archive.DatasetFile("events")))).num_rows == 0
    doc = archive.manifest(DAY, "acme", files, T0)
    assert doc["files"]["messages"]["key"] == ("v1/messages/day=2026-11-20/tenant=acme/"
                                               "part-0.parquet")
    assert doc["files"]["messages"]["rows"] == 115
    assert doc["files"]["events"]["bytes"] == files["events"][1].size
    assert archive.manifest_key(DAY, "acme") == "v1/_manifests/day=2026-11-20/tenant=acme.json"
    assert archive.manifest_of("archive/" + archive.manifest_key(DAY, "acme")) == (DAY, "acme")
    assert archive.manifest_of(doc["files"]["messages"]["key"]) is None


def pa_buffer(data: bytes) -> Any:
    import pyarrow as pa

    return pa.BufferReader(data)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("archive")
    recs = archive.records(day_rows(), KEYS)
    for name in archive.DATASETS:
        f = archive.DatasetFile(name)
        f.add(recs[name])
        path = root / archive.data_key(name, DAY, "acme")
        path.parent.mkdir(parents=True)
        path.write_bytes(encoded(f))
    return root


@pytest.fixture(scope="module")
def results(root: Path) -> dict[str, list[dict[str, Any]]]:
    return report.run(report.Chdb(root))


def test_chdb_and_duckdb_agree(root: Path, results: dict[str, list[dict[str, Any]]]) -> None:
    """Two engines, two dialects, one archive: the same rows, in the same order (ClickHouse's
    ``quantile`` and DuckDB's ``quantile_cont`` interpolate alike on samples this small)."""
    duck = report.run(report.Duckdb(root))
    assert set(duck) == set(results)
    for name, rows in results.items():
        assert len(duck[name]) == len(rows), name
        for ours, theirs in zip(rows, duck[name], strict=True):
            assert list(ours) == list(theirs), name
            for column, value in ours.items():
                other = theirs[column]
                if isinstance(value, int | float) and not isinstance(value, bool):
                    assert float(other) == pytest.approx(float(value), abs=1), (name, column)
                else:
                    assert other == value, (name, column)


def test_latency_percentiles(results: dict[str, list[dict[str, Any]]]) -> None:
    by_provider = {r["provider"]: r for r in results["latency_by_provider"]}
    tw = by_provider["twilio"]
    expected = statistics.quantiles(range(1, 101), n=100, method="inclusive")
    assert tw["messages"] == 100
    assert tw["p50_ms"] == pytest.approx(expected[49], abs=1)
    assert tw["p90_ms"] == pytest.approx(expected[89], abs=1)
    assert tw["p99_ms"] == pytest.approx(expected[98], abs=1)
    assert (by_provider["vonage"]["messages"], by_provider["vonage"]["p99_ms"]) == (8, 1000)
    assert by_provider["sendgrid"]["p50_ms"] == 20
    assert {r["country"]: r["messages"] for r in results["latency_by_country"]} == {
        "CH": 100, "US": 8, "": 4}
    assert {r["tier"]: r["messages"] for r in results["latency_by_tier"]} == {"P1": 100,
                                                                                "P3": 12}
    assert {r["tier"]: r["p50_ms"] for r in results["provider_accepted_by_tier"]} == {
        "P1": 50, "P3": 100}


def test_error_rates_and_codes(results: dict[str, list[dict[str, Any]]]) -> None:
    errors = {r["provider"]: r for r in results["errors_by_provider"]}
    assert (errors["twilio"]["attempts"], errors["twilio"]["refused"]) == (103, 3)
    assert errors["twilio"]["error_rate"] == pytest.approx(3 / 103, abs=1e-4)
    assert (errors["vonage"]["attempts"], errors["vonage"]["delivery_failed"]) == (10, 2)
    assert errors["vonage"]["error_rate"] == pytest.approx(0.2)
    assert errors["sendgrid"]["error_rate"] == 0
    codes = {(r["provider"], r["stage"], r["code"]): r["n"] for r in results["error_codes"]}
    assert codes == {("twilio", "send", "http_503"): 3, ("vonage", "receipt", "FAILED 4"): 2}


def test_campaign_funnel(results: dict[str, list[dict[str, Any]]]) -> None:
    [funnel] = results["campaign_funnel"]
    assert funnel == {"campaign_id": CAMPAIGN, "accepted": 5, "provider_accepted": 4,
                      "delivered": 4, "opened": 4, "clicked": 2, "failed": 0, "suppressed": 1}


def test_plots_are_written(results: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    written = report.plot(results, tmp_path)
    assert {p.name for p in written} == {"latency.png", "errors.png", "funnel.png"}
    assert all(p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG" for p in written)


class Signal:
    def __init__(self, values: list[float | None]) -> None:
        self.values = values
        self.asked = 0

    async def p0_worst(self) -> float | None:
        self.asked += 1
        if len(self.values) > 1:
            return self.values.pop(0)
        return self.values[0]


def test_the_archive_reads_yield_to_p0_by_its_signal() -> None:
    """Calm: the window grows from its slow start; P0 slow (above 0.35 of its 1 s SLA): halved
    at once, shut after a few slices, and the next slice waits, a tick at a time, until the
    signal falls."""
    from notiflow.ops.archive_cli import Yielding
    from notiflow.settings import Settings, YieldRule

    settings = Settings(bulk_yield=YieldRule(tick=timedelta(milliseconds=1)))
    signal = Signal([None, 0.1, 0.1, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.05])

    async def run() -> tuple[list[int], float]:
        gate = Yielding(settings, signal)
        return [await gate.concurrency() for _ in range(8)], gate.waited_s

    limits, waited = asyncio.run(run())
    assert limits == [9, 12, 16, 8, 4, 2, 1, 3]
    assert waited == pytest.approx(0.004) and signal.asked == 12
    calm = Yielding(settings, None)
    assert asyncio.run(calm.concurrency()) > 0
