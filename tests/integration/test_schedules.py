"""Recurring schedules against the real stack: the API, a scheduler materialising occurrences
into buckets and releasing them to Kafka, pause (cancels what was made), resume, delete."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session

from notiflow.correlation import CorrelationKeys
from notiflow.devenv import free_port
from notiflow.schemas.schedules import occurrence_message_id
from notiflow.schemas.scheduling import bucket_of, shard_of
from tests.integration.conftest import Isolated
from tests.integration.test_scheduler import published

pytestmark = pytest.mark.integration


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def body(version: int, **extra: Any) -> dict[str, Any]:
    return {"message": {"channel": "SMS", "tier": "P3", "recipient": "+14155550177",
                        "template_id": "otp", "template_version": version,
                        "variables": {"code": "7"}, "category": "marketing"}, **extra}


@pytest.fixture
def scheduled(isolated: Callable[..., Isolated]) -> tuple[Isolated, str]:
    """A namespace with an API and a scheduler that materialises every second, 150 s
    ahead."""
    iso = isolated("schedules", NOTIFLOW_SCHEDULING__HORIZON="PT150S",
                   NOTIFLOW_SCHEDULING__MATERIALIZE_EVERY="PT1S")
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    iso.start("api", ["api"], NOTIFLOW_API_PORT=str(port)).wait_http(f"{api}/healthz")
    proc = iso.start("scheduler", ["flow", "scheduler", "--name", "sched-test"])
    proc.wait_until(lambda: "claimed shard" in proc.log_path.read_text(errors="replace"))
    return iso, api


def test_a_schedule_fires_pauses_resumes_and_is_deleted(
        scheduled: tuple[Isolated, str], tokens: dict[str, str],
        otp_template: dict[str, int], cql: Session) -> None:
    iso, api = scheduled
    token = tokens["mkt"]
    start = (datetime.now(UTC) + timedelta(seconds=6)).replace(microsecond=0)
    r = httpx.post(f"{api}/v1/schedules", headers=auth(token), json=body(
        otp_template["mkt"], rrule="FREQ=MINUTELY", timezone="Europe/Paris",
        starts_at=start.isoformat()))
    assert r.status_code == 201, r.text
    sched = r.json()
    sid = sched["schedule_id"]
    assert sched["state"] == "active" and sched["recipient_masked"] != "+14155550177"
    nxt = [datetime.fromisoformat(x) for x in sched["next"]]
    assert nxt[0] == start and len(nxt) == 5
    assert all(b - a == timedelta(minutes=1) for a, b in itertools.pairwise(nxt))

    listed = httpx.get(f"{api}/v1/schedules", headers=auth(token)).json()["schedules"]
    assert sid in {s["schedule_id"] for s in listed}
    assert httpx.get(f"{api}/v1/schedules/{sid}", headers=auth(tokens["acme"])
                     ).status_code == 404

    keys = CorrelationKeys.from_settings(iso.settings)
    first = occurrence_message_id(keys, sid, nxt[0])
    topic = iso.settings.ingest_topic("SMS", "P3")  # type: ignore[arg-type]
    seen = published(iso.settings, topic, {first}, time.monotonic() + 8)
    assert first in seen, "the first occurrence was not published"
    assert min(seen[first]) >= nxt[0] - timedelta(milliseconds=5)
    made = [occurrence_message_id(keys, sid, at) for at in nxt[1:3]]
    rows = {mid: row["status"] for mid in made if (row := cql.execute(
        "SELECT status FROM messages WHERE message_id = %s", (mid,)).one())}
    assert rows == dict.fromkeys(made, "SCHEDULED"), "the horizon's occurrences were not made"

    paused = httpx.post(f"{api}/v1/schedules/{sid}/pause", headers=auth(token))
    assert paused.status_code == 200, paused.text
    assert paused.json()["state"] == "paused" and paused.json()["next"] == []
    assert paused.json()["cancelled_occurrences"] == 2
    gone = [cql.execute("SELECT message_id FROM scheduled_work WHERE time_bucket = %s AND "
                        "shard = %s AND scheduled_at = %s AND message_id = %s",
                        (*_place(iso, mid, at), at, mid)).one()
            for mid, at in zip(made, nxt[1:3], strict=True)]
    assert gone == [None, None], "a cancelled occurrence kept its scheduled row"

    resumed = httpx.post(f"{api}/v1/schedules/{sid}/resume", headers=auth(token))
    assert resumed.json()["state"] == "active"
    assert datetime.fromisoformat(resumed.json()["next"][0]) > datetime.now(UTC)
    deleted = httpx.delete(f"{api}/v1/schedules/{sid}", headers=auth(token))
    assert deleted.status_code == 200 and deleted.json()["state"] == "deleted"
    assert httpx.get(f"{api}/v1/schedules/{sid}", headers=auth(token)).status_code == 404


def _place(iso: Isolated, message_id: str, at: datetime) -> tuple[datetime, int]:
    rule = iso.settings.scheduling
    return bucket_of(at, rule.bucket), shard_of(message_id, rule.shards)


@pytest.mark.parametrize(("extra", "field"), [
    ({"cron": "61 * * * *"}, "cron"),
    ({"rrule": "FREQ=SOMETIMES"}, "rrule"),
    ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone"),
    ({"cron": "0 0 30 2 *"}, "cron"),
    ({"rrule": "FREQ=SECONDLY"}, "rrule"),
    ({"rrule": "FREQ=MINUTELY;INTERVAL=1", "timezone": "UTC",
      "ends_at": "2000-01-01T00:00:00Z"}, "ends_at"),
])
def test_bad_schedules_are_422_naming_the_field(
        api: str, tokens: dict[str, str],
        otp_template: dict[str, int], extra: dict[str, str], field: str) -> None:
    r = httpx.post(f"{api}/v1/schedules", headers=auth(tokens["mkt"]),
                   json=body(otp_template["mkt"], **extra))
    assert r.status_code == 422, r.text
    assert r.json()["reason"] == "invalid_schedule" and r.json()["field"] == field, r.text


def test_schedule_shape_errors_are_422(api: str,
                                       tokens: dict[str, str],
                                       otp_template: dict[str, int]) -> None:
    both = body(otp_template["mkt"], cron="0 9 * * *", rrule="FREQ=DAILY")
    p1 = body(otp_template["mkt"], cron="0 9 * * *")
    p1["message"]["tier"] = "P1"
    timed = body(otp_template["mkt"], cron="0 9 * * *")
    timed["message"]["scheduled_at"] = "2027-01-01T00:00:00Z"
    for bad in (both, p1, timed, body(otp_template["mkt"])):
        r = httpx.post(f"{api}/v1/schedules", headers=auth(tokens["mkt"]), json=bad)
        assert r.status_code in (403, 421, 422), r.text


def test_the_zone_defaults_to_the_tenants_or_is_the_recipients(
        api: str, tokens: dict[str, str],
        otp_template: dict[str, int]) -> None:
    token = tokens["mkt"]
    tenant_zone = httpx.post(f"{api}/v1/schedules", headers=auth(token),
                             json=body(otp_template["mkt"], cron="0 9 * * *"))
    assert tenant_zone.status_code == 201 and tenant_zone.json()["timezone"] == "UTC"
    theirs = httpx.post(f"{api}/v1/schedules", headers=auth(token), json=body(
        otp_template["mkt"], cron="0 9 * * *", timezone="recipient"))
    assert theirs.status_code == 201, theirs.text
    assert theirs.json()["timezone"] == "America/Los_Angeles"
    assert datetime.fromisoformat(theirs.json()["next"][0]).hour in (16, 17)
    unknown = body(otp_template["mkt"], cron="0 9 * * *", timezone="recipient")
    unknown["message"]["recipient"] = "+18002752273"
    r = httpx.post(f"{api}/v1/schedules", headers=auth(token), json=unknown)
    assert r.status_code == 422 and r.json()["field"] == "timezone", r.text
    for sid in (tenant_zone.json()["schedule_id"], theirs.json()["schedule_id"]):
        assert httpx.delete(f"{api}/v1/schedules/{sid}", headers=auth(token)).status_code == 200
