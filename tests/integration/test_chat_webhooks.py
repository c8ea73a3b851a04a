"""The CHAT channel end to end: messages to Slack and Microsoft Teams
incoming webhooks through the API, the P1 send flow and the emulators; webhook URLs no chat
provider serves refused at the API; a dead webhook suppressed for the next message; posts to
one webhook paced; Teams' connector answers; and Slack's SDK and an Adaptive Cards client
taken by the emulators (so the emulators follow the services' wire formats, not ours)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from adaptive_cards.card import AdaptiveCard, TextBlock
from adaptive_cards.client import TeamsClient
from cassandra.cluster import Session
from slack_sdk.webhook import WebhookClient

from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.ops.procs import ManagedProcess
from notiflow.providers.teams.client import TeamsWebhook
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings
from tests.helpers import create_template, emulator_records, message_row, wait_for

pytestmark = pytest.mark.integration

TERMINAL = frozenset({"FAILED", "SUPPRESSED", "PROVIDER_ACCEPTED", "EXPIRED"})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def slack_url(settings: Settings, token: str = "ok") -> str:
    return f"{settings.slack.webhook_prefixes[0]}T{uuid.uuid4().hex[:8]}/B0001/{token}Token"


def teams_url(settings: Settings, kind: str = "workflows") -> str:
    prefix = next(p for p in settings.teams.webhook_prefixes if f"/{kind}/" in p)
    return f"{prefix}{uuid.uuid4().hex}/triggers/manual/paths/invoke?api-version=1&sig=s"


@pytest.fixture(scope="module")
def version(api: str, tokens: dict[str, str]) -> int:
    return create_template(api, tokens["acme"], template_id="chat-deploy", channel="CHAT",
                           subject="Release", body="Deploy of {{ service }} done")


def send(api: str, token: str, recipient: str, version: int, service: str = "api",
         tier: str = "P1") -> httpx.Response:
    return httpx.post(f"{api}/v1/messages", headers={
        **bearer(token), "Idempotency-Key": uuid.uuid4().hex}, json={
        "channel": "CHAT", "tier": tier, "recipient": recipient, "template_id": "chat-deploy",
        "template_version": version, "variables": {"service": service}})


def accepted(api: str, token: str, recipient: str, version: int, **kw: Any) -> str:
    r = send(api, token, recipient, version, **kw)
    assert r.status_code == 202, r.text
    return str(r.json()["message_id"])


def ended(cql: Session, mid: str, timeout: float = 30) -> dict[str, Any]:
    def row() -> dict[str, Any] | None:
        r = message_row(cql, mid)
        return r if r and r["status"] in TERMINAL else None

    return wait_for(row, timeout=timeout, what=f"a terminal status of {mid}")


def test_chat_messages_reach_slack_and_teams_with_slack_variables_escaped(
        api: str, tokens: dict[str, str], version: int, send_p1: ManagedProcess,
        cql: Session, fakes: str, settings: Settings) -> None:
    acme = tokens["acme"]
    service = "<!channel> api & web"
    slack, teams = slack_url(settings), teams_url(settings)
    ids = {"slack": accepted(api, acme, slack, version, service=service),
           "teams": accepted(api, acme, teams, version, service=service)}
    for provider, mid in ids.items():
        row = ended(cql, mid)
        assert row["status"] == "PROVIDER_ACCEPTED", row
        assert row["recipient_masked"] == f"{fakes}/…"
        [record] = emulator_records(fakes, mid, (provider,))
        assert record["to"] == (slack if provider == "slack" else teams)
        assert record["sid"] == f"{mid}:1"
        expected = ("&lt;!channel&gt; api &amp; web" if provider == "slack"
                    else r"\<!channel\> api \& web")
        assert record["body"] == f"Deploy of {expected} done"


def test_the_api_refuses_webhooks_no_chat_provider_serves(
        api: str, tokens: dict[str, str], version: int, settings: Settings) -> None:
    acme = tokens["acme"]
    for url in ("https://evil.example/services/T/B/x", "https://hooks.slack.com/services/T/B/x",
                settings.slack.webhook_prefixes[0].replace("127.0.0.1", "localhost") + "T/B/x"):
        r = send(api, acme, url, version)
        assert r.status_code == 422, r.text
        assert r.json()["reason"] == "recipient_not_served"
        assert settings.slack.webhook_prefixes[0] in r.json()["message"]
        assert "evil" not in r.json()["message"]
    for bad in ("https://a:b@hooks.slack.com/services/x", "ftp://hooks.slack.com/services/x",
                slack_url(settings) + "/../../_admin/reset"):
        r = send(api, acme, bad, version)
        assert r.status_code == 422, r.text
        assert r.json()["reason"] == "invalid_body"


def test_a_revoked_webhook_is_suppressed_for_the_next_message(
        api: str, tokens: dict[str, str], version: int, send_p1: ManagedProcess,
        cql: Session, fakes: str, settings: Settings) -> None:
    acme = tokens["acme"]
    url = slack_url(settings, "revoked")
    first = ended(cql, accepted(api, acme, url, version))
    assert (first["status"], first["reason"]) == ("FAILED", "invalid_recipient")
    mid = wait_for(lambda: (m := accepted(api, acme, url, version))
                   and ended(cql, m)["status"] == "SUPPRESSED" and m, timeout=30,
                   what="a message to the revoked webhook suppressed")
    row = ended(cql, mid)
    assert row["reason"] == "webhook_revoked"
    assert not emulator_records(fakes, mid, ("slack",))


def test_posts_to_one_webhook_are_paced(
        api: str, tokens: dict[str, str], version: int, send_p1: ManagedProcess,
        cql: Session, fakes: str, settings: Settings) -> None:
    """Slack's pace is one post a second per webhook; the emulator throttles a third post in
    a second. Five messages to one webhook all arrive, none throttled, one slot apart; a
    message to another webhook is not held behind them."""
    acme = tokens["acme"]
    httpx.post(f"{fakes}/_admin/slack/config",
               json={"pace_limit": 2, "pace_window_s": 1.0}).raise_for_status()
    try:
        url = slack_url(settings)
        ids = [accepted(api, acme, url, version, service=f"s{i}") for i in range(5)]
        other = accepted(api, acme, slack_url(settings), version)
        rows = [ended(cql, mid, timeout=60) for mid in [*ids, other]]
        assert {r["status"] for r in rows} == {"PROVIDER_ACCEPTED"}, rows
        posts = [r for r in emulator_records(fakes, providers=("slack",)) if r["to"] == url]
        assert {p["outcome"] for p in posts} == {"accepted"}, posts
        times = sorted(p["received_at"] for p in posts)
        assert len(times) == 5
        assert times[-1] - times[0] >= 3.6
        paced = {mid for mid in ids if any(
            e["reason"] == "webhook_paced" for e in cql.execute(
                "SELECT reason FROM message_events WHERE message_id = %s", (mid,)))}
        assert len(paced) >= 3
        [other_post] = emulator_records(fakes, other, ("slack",))
        assert other_post["received_at"] < times[-1]
    finally:
        httpx.post(f"{fakes}/_admin/slack/reset").raise_for_status()


def message(recipient: str) -> OutboundMessage:
    return OutboundMessage(message_id=uuid.uuid4().hex, attempt=1, tenant_id="acme",
                           channel=Channel.CHAT, tier=Tier.P1, recipient=recipient,
                           body="Deploy done", subject="Release")


async def test_a_teams_connector_takes_posts_and_reports_throttling_inside_a_200(
        fakes: str, settings: Settings) -> None:
    client = await TeamsWebhook.open(settings, timeout=5.0)
    try:
        url = teams_url(settings, "webhookb2")
        ok = await client.send(message(url))
        assert (ok.outcome, ok.provider_message_id is not None) == (Outcome.ACCEPTED, True)
        httpx.post(f"{fakes}/_admin/teams/config", json={"error_rate_429": 1.0})
        throttled = await client.send(message(url))
        assert (throttled.outcome, throttled.reason, throttled.error_code) == (
            Outcome.TRANSIENT, "rate_limited", "http_200_429")
        outside = await client.send(message("https://evil.example/webhookb2/x"))
        assert (outside.outcome, outside.reason) == (Outcome.PERMANENT, "recipient_not_served")
    finally:
        await client.aclose()
        httpx.post(f"{fakes}/_admin/teams/reset").raise_for_status()


def test_slacks_sdk_and_an_adaptive_cards_client_are_taken_by_the_emulators(
        fakes: str, settings: Settings) -> None:
    url = slack_url(settings)
    sdk = WebhookClient(url).send(text="fallback", blocks=[
        {"type": "section", "text": {"type": "mrkdwn", "text": "from *slack_sdk*"}}])
    assert (sdk.status_code, sdk.body) == (200, "ok")
    refused = WebhookClient(url).send(text="")
    assert (refused.status_code, refused.body) == (400, "no_text")
    revoked = WebhookClient(slack_url(settings, "revoked")).send(text="x")
    assert (revoked.status_code, revoked.body) == (403, "invalid_token")
    records = [r for r in emulator_records(fakes, providers=("slack",)) if r["to"] == url]
    assert [r["body"] for r in records if r["outcome"] == "accepted"] == ["from *slack_sdk*"]

    card = AdaptiveCard.new().version("1.4").add_item(TextBlock(text="from a card")).create()
    for kind, status in (("workflows", 202), ("webhookb2", 200)):
        target = teams_url(settings, kind)
        response = TeamsClient(target).send(card, timeout=10)
        assert response.status_code == status
        [record] = [r for r in emulator_records(fakes, providers=("teams",))
                    if r["to"] == target]
        assert (record["outcome"], record["body"]) == ("accepted", "from a card")
