"""Campaign state webhooks: the body a state change becomes, and the notifier's outcomes —
delivered (deleted), retried on the scaled schedule or a longer Retry-After, given up on 410,
an exhausted schedule or a tenant without a secret; one attempt per claim."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from pydantic import SecretStr

from notiflow.adapters.campaign_notices import Notice, notice_of
from notiflow.adapters.campaign_store import CampaignRow, Progress
from notiflow.adapters.client_webhooks import AttemptResult, Verdict, signed_headers
from notiflow.devenv import webhook_secret
from notiflow.flows.campaigns.state_notices import Notifier
from notiflow.schemas.campaigns import CampaignRequest
from notiflow.settings import Settings, TenantConfig

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def campaign(webhook: str | None = "https://hooks.example/campaigns") -> CampaignRow:
    req = CampaignRequest.model_validate({
        "name": "sale", "channel": "SMS", "template_id": "w", "template_version": 1,
        "manifest": "s3://b/m.csv", "mapping": {"recipient": "phone"},
        **({"webhook": webhook} if webhook else {})})
    return CampaignRow("mkt", "cmp_" + "e" * 32, "sale", req, "completed", "quota", NOW,
                       NOW + timedelta(days=1), 10.0, 5, NOW, NOW, NOW,
                       Progress(rows_read=7, expanded=5, rejected=2))


class Board:
    def __init__(self, notices: list[Notice]) -> None:
        self.notices = {n.webhook_id: n for n in notices}
        self.log: list[tuple[str, int, datetime | None, str]] = []

    async def add(self, n: Notice) -> None:
        self.notices.setdefault(n.webhook_id, n)

    async def due(self, now: datetime) -> list[Notice]:
        return [n for n in self.notices.values() if n.gave_up_at is None and n.next_at <= now]

    async def claim(self, n: Notice, until: datetime) -> bool:
        current = self.notices[n.webhook_id]
        if current.next_at != n.next_at:
            return False
        self.notices[n.webhook_id] = dataclasses.replace(current, next_at=until)
        return True

    async def retry(self, n: Notice, attempt: int, at: datetime, error: str) -> None:
        self.notices[n.webhook_id] = dataclasses.replace(n, attempt=attempt, next_at=at)
        self.log.append(("retry", attempt, at, error))

    async def give_up(self, n: Notice, attempt: int, at: datetime, error: str) -> None:
        self.notices[n.webhook_id] = dataclasses.replace(n, attempt=attempt, gave_up_at=at)
        self.log.append(("gave_up", attempt, at, error))

    async def done(self, n: Notice) -> None:
        del self.notices[n.webhook_id]
        self.log.append(("done", n.attempt, None, ""))


def answers(*codes: int, retry_after: float | None = None):  # type: ignore[no-untyped-def]
    calls: list[tuple[str, str, bytes]] = []
    codes_left = list(codes)

    async def post(url: str, wid: str, body: bytes,
                   secrets: Sequence[SecretStr]) -> AttemptResult:
        calls.append((url, wid, body))
        code = codes_left.pop(0)
        verdict = (Verdict.DELIVERED if code < 300 else Verdict.GONE if code == 410
                   else Verdict.RETRY)
        return AttemptResult(verdict, f"http_{code}", NOW, NOW, code, retry_after)

    return post, calls


def settings(secret: bool = True) -> Settings:
    tenant = TenantConfig(id="mkt", token=SecretStr("t" * 32),
                          webhook_secrets=(SecretStr(webhook_secret()),) if secret else ())
    return Settings().model_copy(update={"tenants": (tenant,), "time_scale": 1.0})


def test_the_body_names_the_change_and_no_recipient() -> None:
    n = notice_of(campaign(), campaign().counts(), NOW)
    ms = int(NOW.timestamp() * 1000)
    assert n is not None and n.webhook_id == f"{'cmp_' + 'e' * 32}_completed_{ms}"
    body = orjson.loads(n.body)
    assert body["type"] == "campaign.state"
    assert body["data"]["state"] == "completed" and body["data"]["reason"] == "quota"
    assert body["data"]["counts"]["expanded"] == 5
    assert notice_of(campaign(webhook=None), campaign().counts(), NOW) is None
    signed_headers([webhook_secret()], n.webhook_id, NOW, n.body)


async def test_delivered_retried_and_given_up() -> None:
    clock = [NOW]
    n = notice_of(campaign(), campaign().counts(), NOW)
    assert n is not None
    board = Board([n])
    post, calls = answers(503, 500, 200)
    notifier = Notifier(settings(), board, post, clock=lambda: clock[0])
    assert await notifier.tick() == 1
    assert board.log[-1][:2] == ("retry", 1)
    assert board.log[-1][2] == NOW + timedelta(seconds=5)
    assert await notifier.tick() == 0
    clock[0] = NOW + timedelta(seconds=5)
    assert await notifier.tick() == 1 and board.log[-1][:2] == ("retry", 2)
    clock[0] = NOW + timedelta(minutes=6)
    assert await notifier.tick() == 1 and board.log[-1][0] == "done"
    assert {wid for _, wid, _ in calls} == {n.webhook_id} and board.notices == {}

    gone = Board([n])
    post, _ = answers(410)
    await Notifier(settings(), gone, post, clock=lambda: NOW).tick()
    assert gone.log == [("gave_up", 1, NOW, "http_410")]

    slow = Board([n])
    post, _ = answers(429, retry_after=3600)
    await Notifier(settings(), slow, post, clock=lambda: NOW).tick()
    assert slow.log[-1][2] == NOW + timedelta(hours=1)

    orphan = Board([n])
    post, calls = answers()
    await Notifier(settings(secret=False), orphan, post, clock=lambda: NOW).tick()
    assert orphan.log[-1][0] == "gave_up" and calls == []


@pytest.mark.parametrize("attempts", [8])
async def test_the_schedule_ends(attempts: int) -> None:
    n = notice_of(campaign(), campaign().counts(), NOW)
    assert n is not None
    board = Board([n])
    post, _ = answers(*[500] * attempts)
    clock = [NOW]
    notifier = Notifier(settings(), board, post, clock=lambda: clock[0])
    for _ in range(attempts):
        clock[0] += timedelta(days=1)
        await notifier.tick()
    assert board.log[-1][:2] == ("gave_up", attempts)
    assert [e[0] for e in board.log].count("retry") == attempts - 1
