"""Breakers and paces of tenant-owned endpoints: a tenant's failing chat webhook or status
webhook opens only that tenant's endpoint breaker, never the shared provider breaker nor
another tenant's; the provider breaker counts only what the provider itself answers."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography.fernet import Fernet

from notiflow.adapters.breaker import AdmissionKind, BreakerParams, ModelStore, State
from notiflow.adapters.breaker.facade import CircuitBreakers
from notiflow.adapters.client_webhooks import AttemptResult, Verdict
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.ports import Slot
from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.chat import (
    breaker_label,
    endpoint_breaker,
    provider_evidence,
    shared_host,
)
from notiflow.adapters.webhook_pace import webhook_key
from notiflow.flows.common.items import SourceRef, Work
from notiflow.flows.send.routing import Choice
from notiflow.flows.send.stages.call import Call
from notiflow.flows.send.stages.context import SendContext
from notiflow.flows.send.stages.endpoints import endpoint_of, reports
from notiflow.flows.send.stages.route import Quota
from notiflow.flows.send.stages.send_batch import Prepared
from notiflow.flows.webhooks.webhook_sender import Request, WebhookDispatcher, breaker_id
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.schemas.messages import IngestRecord, StatusEvent
from notiflow.settings import BreakerRule, PaceRule, Settings
from tests.fakes import ManualClock
from tests.helpers import partial_ports

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
T0 = 1_700_000_000_000_000
A_HOOK = "https://acme.webhook.office.com/webhookb2/a1"
B_HOOK = "https://globex.webhook.office.com/webhookb2/b1"
SLACK_HOOK = "https://hooks.slack.com/services/T0001/B0001/abcd"


class DualClock(ManualClock[int]):
    """Microseconds for the breakers; the same moment as a datetime for the send step."""

    def __init__(self) -> None:
        super().__init__(T0)

    def moment(self) -> datetime:
        return NOW + timedelta(microseconds=self.now - T0)


def breakers(clock: DualClock) -> CircuitBreakers:
    params = BreakerParams.from_rule(BreakerRule())
    return CircuitBreakers(ModelStore(params, clock), clock_us=clock)


def work(tenant: str, url: str, n: int = 0) -> Work:
    doc = {"channel": "CHAT", "tier": "P1", "recipient": url, "template_id": "alert",
           "template_version": 1, "tenant_id": tenant, "message_id": f"msg_{tenant}_{n}",
           "accepted_at": NOW.isoformat(),
           "expires_at": (NOW + timedelta(hours=1)).isoformat()}
    return Work(IngestRecord.model_validate(doc), SourceRef("ingest.chat.p1", 0, n), b"{}",
                None)


def message(w: Work) -> OutboundMessage:
    return OutboundMessage(message_id=w.message_id, attempt=1, tenant_id=w.record.tenant_id,
                           channel=Channel.CHAT, tier=Tier.P1, recipient=w.record.recipient,
                           body="hi")


class Workflow:
    """A Teams provider whose posts answer as each tenant's workflow chooses."""

    provider_id = "teams"
    channel = Channel.CHAT

    def __init__(self, clock: DualClock) -> None:
        self.clock = clock
        self.sent: list[str] = []

    async def send(self, msg: OutboundMessage) -> SendResult:
        self.sent.append(msg.tenant_id)
        at = self.clock.moment()
        if msg.tenant_id == "acme":
            return SendResult(Outcome.TRANSIENT, "teams", at, at, reason="server_error",
                              error_code="http_503")
        return SendResult(Outcome.ACCEPTED, "teams", at, at, provider_message_id="x")

    async def aclose(self) -> None:
        return None


class NoQuota:
    async def acquire(self, *args: Any) -> None:
        return None


class Leases:
    def lease_key(self, message_id: str, attempt: int) -> str:
        return f"lease:{message_id}:{attempt}"

    def gate_key(self, message_id: str) -> str:
        return f"gate:{message_id}"

    async def release(self, keys: list[str]) -> None:
        return None


def send_context(clock: DualClock, cb: CircuitBreakers, provider: Workflow,
                 pace: Any = None) -> SendContext:
    settings = Settings()
    ctx = SendContext(settings, Tier.P1, settings.policy(Tier.P1),
                      DlqCipher(Fernet.generate_key()), clock.moment, random.Random(1), "send.p1")
    ctx.attach(partial_ports(breakers=cb, quota=NoQuota(), leases=Leases(),
                             providers={"teams": provider}, pace=pace))
    return ctx


async def one(ctx: SendContext, w: Work, provider: Workflow) -> Choice | list[Any]:
    """One attempt through the send step's quota and call stages."""
    item = Prepared(w, message(w), None)
    outs = await Quota()(item, ctx)
    if outs is not None:
        return outs
    assert item.choice is not None and item.provider is provider
    await Call()(item, ctx)
    return item.choice


def test_a_tenants_503ing_workflow_opens_only_its_own_endpoint_breaker() -> None:
    """Tenant acme's workflow answers 503 to every post; globex's posts through the same
    provider keep going, and the shared ``teams`` breaker stays closed."""
    clock = DualClock()
    cb = breakers(clock)
    provider = Workflow(clock)
    ctx = send_context(clock, cb, provider)

    async def scenario() -> tuple[list[Any], list[Any]]:
        acme, globex = [], []
        for i in range(40):
            acme.append(await one(ctx, work("acme", A_HOOK, i), provider))
            globex.append(await one(ctx, work("globex", B_HOOK, i), provider))
            clock.now += 250_000
        return acme, globex

    acme, globex = asyncio.run(scenario())
    assert all(isinstance(c, Choice) for c in globex)
    assert provider.sent.count("globex") == 40
    assert provider.sent.count("acme") == 5
    waited = [c for c in acme if not isinstance(c, Choice)]
    assert len(waited) == 35
    events = [o for outs in waited for o in outs if isinstance(o, StatusEvent)]
    assert {(e.status, e.reason) for e in events} == {
        (Status.RETRY_PENDING, "endpoint_breaker_open")}
    assert cb.state("teams") is State.CLOSED
    assert cb.state(endpoint_breaker("acme", A_HOOK)) is State.OPEN
    assert cb.state(endpoint_breaker("globex", B_HOOK)) is State.CLOSED


def test_the_same_url_has_a_breaker_per_tenant() -> None:
    assert endpoint_breaker("acme", A_HOOK) != endpoint_breaker("globex", A_HOOK)
    assert endpoint_breaker("acme", A_HOOK) != endpoint_breaker("acme", B_HOOK)
    assert "webhook.office.com" not in endpoint_breaker("acme", A_HOOK)
    assert endpoint_of(work("acme", A_HOOK)) == endpoint_breaker("acme", A_HOOK)
    assert breaker_label(endpoint_breaker("acme", A_HOOK)) == "chat_endpoint"
    assert breaker_label("twilio") == "twilio"


def result(outcome: Outcome, reason: str | None = None, seconds: float = 0.0) -> SendResult:
    return SendResult(outcome, "teams", NOW, NOW + timedelta(seconds=seconds), reason=reason)


TEAMS = Settings().teams.webhook_prefixes
SLACK = Settings().slack.webhook_prefixes


@pytest.mark.parametrize(("res", "url", "prefixes", "expected"), [
    (result(Outcome.ACCEPTED), A_HOOK, TEAMS, (Outcome.ACCEPTED, None, 0.0)),
    (result(Outcome.PERMANENT, "invalid_recipient", 9.0), A_HOOK, TEAMS,
     (Outcome.PERMANENT, "invalid_recipient", 0.0)),
    (result(Outcome.TRANSIENT, "server_error"), A_HOOK, TEAMS, None),
    (result(Outcome.AMBIGUOUS, "gateway_timeout"), A_HOOK, TEAMS, None),
    (result(Outcome.AMBIGUOUS, "timeout"), SLACK_HOOK, SLACK, None),
    (result(Outcome.TRANSIENT, "rate_limited"), A_HOOK, TEAMS, None),
    (result(Outcome.TRANSIENT, "connect_error"), A_HOOK, TEAMS, None),
    (result(Outcome.TRANSIENT, "connect_timeout"), SLACK_HOOK, SLACK, None),
    (result(Outcome.TRANSIENT, "connect_error"), SLACK_HOOK, SLACK,
     (Outcome.TRANSIENT, "connect_error", 0.0)),
    (result(Outcome.PERMANENT, "recipient_not_served"), A_HOOK, SLACK, None),
])
def test_the_provider_breaker_sees_only_what_the_provider_answers(
        res: SendResult, url: str, prefixes: tuple[str, ...],
        expected: tuple[Any, ...] | None) -> None:
    assert provider_evidence(res, url, prefixes) == expected


def test_only_a_host_a_prefix_names_exactly_is_shared() -> None:
    assert shared_host(SLACK_HOOK, SLACK)
    assert not shared_host(A_HOOK, TEAMS)
    assert not shared_host("https://hooks.slack.com.evil.example/services/x", SLACK)
    assert not shared_host("not a url", SLACK)


def test_reports_split_a_chat_outcome_between_provider_and_endpoint() -> None:
    w = work("acme", A_HOOK)
    probe = type("Admission", (), {"probe": True, "episode": 3})()
    choice = Choice("teams", False, None, endpoint=probe)
    prefixes = Settings().webhook_prefixes()
    failed = reports(w, choice, result(Outcome.TRANSIENT, "server_error"), 0.4, prefixes)
    assert [(r.breaker_id, r.outcome, r.probe, r.episode) for r in failed] == [
        (endpoint_breaker("acme", A_HOOK), Outcome.TRANSIENT, True, 3)]
    refused = reports(w, choice, result(Outcome.PERMANENT, "invalid_recipient"), 0.4,
                      prefixes)
    assert [r.breaker_id for r in refused] == ["teams", endpoint_breaker("acme", A_HOOK)]
    forced = Choice("teams", False, None, last_resort=True)
    assert [r.breaker_id for r in reports(w, forced, result(Outcome.ACCEPTED), 0.1,
                                          prefixes)] == [endpoint_breaker("acme", A_HOOK)]
    assert reports(w, choice, result(Outcome.TRANSIENT, "internal_error:KeyError"), 0.1,
                   prefixes) == []


def test_other_channels_report_to_the_provider_alone() -> None:
    doc = {"channel": "SMS", "tier": "P1", "recipient": "+14155550123", "template_id": "t",
           "template_version": 1, "tenant_id": "acme", "message_id": "msg_sms",
           "accepted_at": NOW.isoformat()}
    w = Work(IngestRecord.model_validate(doc), SourceRef("t", 0, 0), b"", None)
    res = SendResult(Outcome.TRANSIENT, "twilio", NOW, NOW, reason="server_error")
    assert endpoint_of(w) is None
    assert [(r.breaker_id, r.outcome, r.latency_s) for r in reports(
        w, Choice("twilio", False), res, 0.5, {})] == [("twilio", Outcome.TRANSIENT, 0.5)]
    assert reports(w, Choice("twilio", False, last_resort=True), res, 0.5, {}) == []


class RecordingPace:
    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []

    async def reserve(self, provider_id: str, webhook: str, rule: PaceRule, *,
                      tenant_id: str) -> Slot:
        self.asked.append((provider_id, tenant_id, webhook))
        return Slot(0, True)

    async def aclose(self) -> None:
        return None


def test_webhook_pace_slots_are_the_tenants_own() -> None:
    assert webhook_key("ns:", "teams", A_HOOK, "acme") != webhook_key("ns:", "teams", A_HOOK,
                                                                      "globex")
    assert "office.com" not in webhook_key("ns:", "teams", A_HOOK, "acme")
    clock = DualClock()
    provider = Workflow(clock)
    pace = RecordingPace()
    ctx = send_context(clock, breakers(clock), provider, pace)
    asyncio.run(one(ctx, work("globex", A_HOOK), provider))
    assert pace.asked == [("teams", "globex", A_HOOK)]


# client status webhooks --------------------------------------------------------------------


class Receiver:
    """A shared webhook host: acme's receiver there answers 503, globex's 200."""

    def __init__(self) -> None:
        self.posts: list[str] = []

    async def vet(self, url: str) -> str:
        return url

    async def post(self, url: str, msg_id: str, body: bytes, secrets: Any) -> AttemptResult:
        self.posts.append(url)
        if "/acme" in url:
            return AttemptResult(Verdict.RETRY, "http_503", NOW, NOW, status_code=503)
        return AttemptResult(Verdict.DELIVERED, "http_200", NOW, NOW, status_code=200)


def request(tenant: str) -> Request:
    return Request("https://hooks.example.net:443", f"https://hooks.example.net/{tenant}",
                   f"wh_{tenant}", b"{}", (), tenant_id=tenant)


def test_client_webhook_breakers_are_keyed_by_tenant_and_endpoint() -> None:
    """Tenant acme's failing receiver on a shared host opens acme's breaker only: globex's
    receiver on that host keeps receiving."""
    clock = DualClock()
    cb = breakers(clock)
    dispatcher = WebhookDispatcher(Settings(), lambda: cb)
    receiver = Receiver()
    dispatcher._client = receiver  # type: ignore[assignment]
    dispatcher._breakers = cb

    async def scenario() -> tuple[list[Any], list[Any]]:
        acme, globex = [], []
        for _ in range(20):
            acme.append(await dispatcher._attempt(request("acme")))
            globex.append(await dispatcher._attempt(request("globex")))
            clock.now += 250_000
        return acme, globex

    acme, globex = asyncio.run(scenario())
    assert all(isinstance(r, AttemptResult) and r.verdict is Verdict.DELIVERED
               for r in globex)
    assert sum(isinstance(r, AttemptResult) for r in acme) == 5
    assert breaker_id("acme", "https://hooks.example.net:443") != \
        breaker_id("globex", "https://hooks.example.net:443")
    assert cb.state(breaker_id("acme", "https://hooks.example.net:443")) is State.OPEN
    assert cb.state(breaker_id("globex", "https://hooks.example.net:443")) is State.CLOSED
    assert request("acme").unit == breaker_id("acme", "https://hooks.example.net:443")


def test_breaker_entries_of_a_process_stay_bounded() -> None:
    """Endpoint ids come from tenant input: a tenant spraying URLs cannot grow a process's
    breakers without bound (the shared state stays in the store)."""
    clock = DualClock()
    params = BreakerParams.from_rule(BreakerRule())
    cb = CircuitBreakers(ModelStore(params, clock), clock_us=clock, max_entries=100)

    async def spray() -> None:
        for i in range(1000):
            admission = await cb.allow(endpoint_breaker("acme", f"{A_HOOK}/{i}"))
            assert admission.kind is AdmissionKind.NORMAL
        await cb.flush()

    asyncio.run(spray())
    assert len(cb._entries) <= 100
