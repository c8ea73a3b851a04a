"""`notiflow chaos hostile-tenant`, short version: while tenant A attacks every way the
hostile-tenant review found (poison templates, a batch whose template fails at render time,
foreign manifests, private webhook URLs, forged receipts, a 503-ing chat endpoint, bodies far
past every limit, inbox sockets past its cap, ingest records claiming B), tenant B's P0 keeps
its SLA, nothing of B's is lost or changed, no platform process exits, and every request of
A's is answered 4xx or ends as its own outcome."""

from __future__ import annotations

from pathlib import Path

import pytest

from notiflow.ops.chaos_hostile import SHORT, run
from notiflow.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.solo]


@pytest.mark.timeout(240)
def test_no_tenant_can_stop_slow_or_read_another(stack: Settings, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    report = run(tmp_path, SHORT, log=lambda _m: None)
    with capsys.disabled():
        print(f"\n{report.as_dict()}")
    assert report.violations() == []
    assert report.b_accepted >= SHORT.messages
    assert report.p0_samples > 0
    assert report.inbox.get("A 429 tenant_connections", 0) > 0
    answers = report.a_answers
    assert answers["campaign manifest: B's manifest"] == {"422 manifest_not_allowed": 1}
    assert answers["campaign manifest: B's prefix, no object"] == {
        "422 manifest_not_allowed": 1}
    for trick in ("own prefix/../B", "own prefix/%2e%2e/B", "double slash to B"):
        assert answers[f"campaign manifest: {trick}"] == {"422 manifest_unreadable": 1}
    assert set(answers["status_webhook private"]) == {"422 webhook_url_not_allowed"}
    assert set(answers["marketing at P0"]) == {"422 category_tier_not_allowed"}
    assert report.a_outcomes["batch render-bomb item"] == {
        "FAILED render_error": SHORT.batch}
    assert report.signed_forgeries > 0 and report.receipts_dropped_as_forged > 0
    assert any("producer:hostile-a" in q for q in report.quarantines)
