"""Client webhooks without I/O: Standard Webhooks signing (the specification's test vector)
and verification, outcome classification, the scaled schedule, and the delivery logic driven
by a fake sender and a fake clock."""

from __future__ import annotations

import concurrent.futures
import random
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Network

import orjson
import pytest
from bytewax.operators import StatefulLogic
from cryptography.fernet import Fernet

from notiflow.adapters.client_webhooks import (
    AttemptResult,
    Verdict,
    WebhookVerificationError,
    classify,
    decode_secret,
    endpoint_id,
    per_attempt,
    retry_after,
    sign,
    signed_headers,
    status_body,
    verify,
    webhook_id,
)
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.providers.base import Outcome
from notiflow.flows.common.items import SourceRef
from notiflow.flows.webhooks.status_webhooks import (
    Refused,
    Request,
    Result,
    WebhookJob,
    WebhookLogic,
    WebhookPolicy,
)
from notiflow.schemas.enums import Status
from notiflow.settings import ClientWebhookRule, EgressSettings, Settings, TenantConfig
from tests.fakes import ManualClock

# The Standard Webhooks reference vector (standard-webhooks libraries' test suites).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = '{"test": 2432232314}'
VECTOR_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
VECTOR_NOW = datetime.fromtimestamp(VECTOR_TS, UTC)
OTHER_SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"


def vector_headers(**changes: str) -> dict[str, str]:
    h = {"webhook-id": VECTOR_ID, "webhook-timestamp": str(VECTOR_TS),
         "webhook-signature": VECTOR_SIG}
    h.update(changes)
    return h


# signing -----------------------------------------------------------------------------------


def test_sign_matches_the_standard_webhooks_vector() -> None:
    assert sign([VECTOR_SECRET], VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG
    assert sign([VECTOR_SECRET.removeprefix("whsec_")], VECTOR_ID, VECTOR_NOW,
                VECTOR_BODY.encode()) == VECTOR_SIG


def test_every_active_secret_signs_in_order() -> None:
    header = sign([OTHER_SECRET, VECTOR_SECRET], VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    first, second = header.split(" ")
    assert second == VECTOR_SIG and first.startswith("v1,") and first != VECTOR_SIG
    h = vector_headers(**{"webhook-signature": header})
    verify(VECTOR_SECRET, h, VECTOR_BODY, now=VECTOR_NOW)
    verify(OTHER_SECRET, h, VECTOR_BODY, now=VECTOR_NOW)
    with pytest.raises(WebhookVerificationError):
        verify("whsec_" + "WlpaWlpaWlpaWlpaWlpaWlpaWlpaWlpa", h, VECTOR_BODY, now=VECTOR_NOW)


def test_signed_headers_and_id_rules() -> None:
    h = signed_headers([VECTOR_SECRET], VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    assert h == vector_headers()
    with pytest.raises(ValueError):
        sign([VECTOR_SECRET], "has.dot", VECTOR_TS, VECTOR_BODY)
    with pytest.raises(ValueError):
        sign([], VECTOR_ID, VECTOR_TS, VECTOR_BODY)


@pytest.mark.parametrize("secret", ["whsec_c2hvcnQ=", "whsec_not base64!", ""])
def test_bad_secrets_are_refused(secret: str) -> None:
    with pytest.raises(ValueError):
        decode_secret(secret)


# verification ------------------------------------------------------------------------------


def test_verify_accepts_the_vector_and_any_header_case() -> None:
    verify(VECTOR_SECRET, vector_headers(), VECTOR_BODY, now=VECTOR_NOW)
    upper = {k.upper(): v for k, v in vector_headers().items()}
    verify([OTHER_SECRET, VECTOR_SECRET], upper, VECTOR_BODY.encode(), now=VECTOR_NOW)


@pytest.mark.parametrize("headers", [
    vector_headers(**{"webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="}),
    vector_headers(**{"webhook-signature": "v1a," + VECTOR_SIG[3:]}),
    vector_headers(**{"webhook-signature": "v1,not-base64"}),
    vector_headers(**{"webhook-id": "msg_other"}),
    vector_headers(**{"webhook-timestamp": "hello"}),
    {k: v for k, v in vector_headers().items() if k != "webhook-id"},
    {k: v for k, v in vector_headers().items() if k != "webhook-timestamp"},
    {k: v for k, v in vector_headers().items() if k != "webhook-signature"},
])
def test_verify_refuses_forged_or_incomplete(headers: dict[str, str]) -> None:
    with pytest.raises(WebhookVerificationError):
        verify(VECTOR_SECRET, headers, VECTOR_BODY, now=VECTOR_NOW)


def test_verify_refuses_a_tampered_body() -> None:
    with pytest.raises(WebhookVerificationError):
        verify(VECTOR_SECRET, vector_headers(), '{"test": 2432232315}', now=VECTOR_NOW)


def test_verify_skips_unknown_versions_among_several() -> None:
    h = vector_headers(**{"webhook-signature": "v2,abc v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ"
                                              "/9tdO6mc= " + VECTOR_SIG})
    verify(VECTOR_SECRET, h, VECTOR_BODY, now=VECTOR_NOW)


@pytest.mark.parametrize(("offset", "ok"), [
    (timedelta(0), True),
    (timedelta(minutes=5), True),
    (-timedelta(minutes=5), True),
    (timedelta(minutes=5, seconds=1), False),
    (-timedelta(minutes=5, seconds=1), False),
])
def test_verification_tolerance(offset: timedelta, ok: bool) -> None:
    """``now - offset`` is when the request claims to have been sent."""
    if ok:
        verify(VECTOR_SECRET, vector_headers(), VECTOR_BODY, now=VECTOR_NOW + offset)
    else:
        with pytest.raises(WebhookVerificationError, match=r"too (old|new)"):
            verify(VECTOR_SECRET, vector_headers(), VECTOR_BODY, now=VECTOR_NOW + offset)


def test_custom_tolerance() -> None:
    later = VECTOR_NOW + timedelta(seconds=31)
    verify(VECTOR_SECRET, vector_headers(), VECTOR_BODY, now=later)
    with pytest.raises(WebhookVerificationError):
        verify(VECTOR_SECRET, vector_headers(), VECTOR_BODY, timedelta(seconds=30), now=later)


# identities, body, outcomes ----------------------------------------------------------------


def test_webhook_id_is_stable_and_dot_free() -> None:
    a = webhook_id("msg_3f2a", Status.DELIVERED)
    assert a == webhook_id("msg_3f2a", "DELIVERED", 3) == "wh_msg_3f2a_DELIVERED"
    assert "." not in a and a != webhook_id("msg_3f2a", Status.SENT)


def test_per_attempt_statuses_get_one_webhook_id_per_attempt() -> None:
    assert [per_attempt(s) for s in (Status.PROCESSING, Status.RETRY_PENDING,
                                     Status.UNKNOWN)] == [True] * 3
    assert not any(per_attempt(s) for s in (Status.PROVIDER_ACCEPTED, Status.FAILED,
                                            Status.DELIVERED))
    assert webhook_id("msg_1", Status.RETRY_PENDING, 1) == "wh_msg_1_RETRY_PENDING_1"
    assert webhook_id("msg_1", Status.RETRY_PENDING, 2) == "wh_msg_1_RETRY_PENDING_2"


def test_rotation_overlap() -> None:
    """During a rotation the tenant lists the new and the old secret: a receiver that holds
    either one (or both) verifies; once the old one is dropped, only the new one does."""
    old, new = VECTOR_SECRET, OTHER_SECRET
    during = signed_headers([new, old], VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    after = signed_headers([new], VECTOR_ID, VECTOR_TS, VECTOR_BODY)
    for held in ([old], [new], [old, new]):
        verify(held, during, VECTOR_BODY, now=VECTOR_NOW)
    verify([old, new], after, VECTOR_BODY, now=VECTOR_NOW)
    with pytest.raises(WebhookVerificationError, match="no matching signature"):
        verify([old], after, VECTOR_BODY, now=VECTOR_NOW)


@pytest.mark.parametrize(("url", "endpoint"), [
    ("https://Hooks.Example.com/a/b?x=1", "https://hooks.example.com:443"),
    ("http://example.com", "http://example.com:80"),
    ("http://user:pw@127.0.0.1:8123/hook", "http://127.0.0.1:8123"),
    ("https://[::1]:9443/x", "https://[::1]:9443"),
])
def test_endpoint_id(url: str, endpoint: str) -> None:
    assert endpoint_id(url) == endpoint


@pytest.mark.parametrize("url", ["ftp://example.com/x", "/relative", "https:///nohost"])
def test_endpoint_id_refuses_non_http(url: str) -> None:
    with pytest.raises(ValueError):
        endpoint_id(url)


def test_body_shape_has_no_recipient_or_content() -> None:
    at = datetime(2026, 8, 15, 10, 0, 1, 250000, tzinfo=UTC)
    doc = orjson.loads(status_body(message_id="msg_1", status=Status.DELIVERED, reason=None,
                                   attempt=2, occurred_at=at, tenant_id="acme"))
    assert doc == {"type": "message.status", "timestamp": "2026-08-15T10:00:01.250000Z",
                   "data": {"message_id": "msg_1", "status": "DELIVERED", "reason": None,
                            "attempt": 2, "occurred_at": "2026-08-15T10:00:01.250000Z",
                            "tenant_id": "acme"}}


@pytest.mark.parametrize(("code", "verdict"), [
    (200, Verdict.DELIVERED), (204, Verdict.DELIVERED), (299, Verdict.DELIVERED),
    (410, Verdict.GONE), (301, Verdict.RETRY), (400, Verdict.RETRY), (404, Verdict.RETRY),
    (408, Verdict.RETRY), (429, Verdict.RETRY), (500, Verdict.RETRY), (503, Verdict.RETRY),
])
def test_classification(code: int, verdict: Verdict) -> None:
    assert classify(code) is verdict


def result(code: int | None, reason: str | None = None) -> AttemptResult:
    now = datetime.now(UTC)
    verdict = classify(code) if code is not None else Verdict.RETRY
    return AttemptResult(verdict, reason or f"http_{code}", now, now, status_code=code)


@pytest.mark.parametrize(("res", "expected"), [
    (result(200), (Outcome.ACCEPTED, None)),
    (result(404), (Outcome.PERMANENT, "http_404")),
    (result(410), (Outcome.PERMANENT, "http_410")),
    (result(429), (Outcome.TRANSIENT, "rate_limited")),
    (result(502), (Outcome.TRANSIENT, "http_502")),
    (result(None, "timeout"), (Outcome.TRANSIENT, "timeout")),
    (result(None, "connect_error"), (Outcome.TRANSIENT, "connect_error")),
])
def test_breaker_outcomes(res: AttemptResult, expected: tuple[Outcome, str | None]) -> None:
    assert res.breaker_outcome() == expected


def test_retry_after_forms() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after("120", now) == 120.0
    assert retry_after("Thu, 01 Jan 2026 00:00:30 GMT", now) == 30.0
    assert retry_after("soon", now) is None and retry_after(None, now) is None


# schedule ----------------------------------------------------------------------------------


SVIX = [0, 5, 300, 1800, 7200, 18000, 36000, 36000]


@pytest.mark.parametrize("scale", [1.0, 0.1, 0.01, 0.0005])
def test_schedule_scales_with_time_scale(scale: float) -> None:
    policy = WebhookPolicy.from_settings(Settings(time_scale=scale))
    assert policy.attempts == 8
    assert [d.total_seconds() for d in policy.delays] == pytest.approx([s * scale for s in SVIX])
    assert policy.span.total_seconds() == pytest.approx(sum(SVIX) * scale)
    assert policy.max_age >= policy.span


def test_delay_is_the_schedule_plus_bounded_jitter_and_honours_retry_after() -> None:
    policy = WebhookPolicy.from_settings(Settings(time_scale=0.01))
    rng = random.Random(7)
    for made in range(1, policy.attempts):
        base = policy.delays[made]
        waits = [policy.delay(made, rng) for _ in range(200)]
        assert all(base <= w <= base * 1.1 for w in waits)
        if base:
            assert max(waits) - min(waits) > base * 0.05
    assert policy.delay(1, rng, retry_after_s=30) == timedelta(seconds=30)
    assert policy.delay(1, rng, retry_after_s=10**6) == policy.longest


# the delivery logic ------------------------------------------------------------------------


class FakeSender:
    """Records requests; the test resolves each future."""

    def __init__(self) -> None:
        self.requests: list[tuple[Request, concurrent.futures.Future[Result]]] = []

    def submit(self, request: Request) -> concurrent.futures.Future[Result]:
        fut: concurrent.futures.Future[Result] = concurrent.futures.Future()
        self.requests.append((request, fut))
        return fut

    def saturated(self) -> bool:
        return False

    def answer(self, value: Result | int) -> Request:
        req, fut = next((r, f) for r, f in self.requests if not f.done())
        fut.set_result(result(value) if isinstance(value, int) else value)
        return req

    @property
    def open(self) -> int:
        return sum(not f.done() for _, f in self.requests)


def make_settings(**rule: object) -> Settings:
    return Settings(
        tenants=[TenantConfig(id="acme", token="t" * 32, webhook_secrets=[VECTOR_SECRET]),
                 TenantConfig(id="nosecret", token="u" * 32)],
        dlq_key=Fernet.generate_key().decode(),
        egress=LOOPBACK,
        client_webhooks=ClientWebhookRule(**rule))  # type: ignore[arg-type]


LOOPBACK = EgressSettings(allow_http=True, allow_networks=(IPv4Network("127.0.0.0/8"),))
"""The receivers of these tests are on loopback, over http (as in the dev environment)."""


SRC = SourceRef("notify.events", 0, 7)


def job(status: Status, mid: str = "msg_a", tenant: str | None = "acme",
        url: str | None = "http://127.0.0.1:9/hook", attempt: int = 1) -> WebhookJob:
    return WebhookJob(mid, tenant, url, status, attempt, None, datetime.now(UTC), SRC)


START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def logic(settings: Settings, sender: FakeSender, clock: ManualClock[datetime],
          resume: object = None) -> WebhookLogic:
    return WebhookLogic(resume, sender=sender, settings=settings,  # type: ignore[arg-type]
                        policy=WebhookPolicy.from_settings(settings),
                        cipher=DlqCipher.from_settings(settings), clock=clock,
                        rng=random.Random(1))


def status_of(req: Request) -> str:
    return str(orjson.loads(req.body)["data"]["status"])


def behind_a_failing_head() -> tuple[FakeSender, ManualClock[datetime], WebhookLogic]:
    """A key whose SENT webhook was answered 500 (its retry pending), with
    PROVIDER_ACCEPTED queued behind it."""
    sender, clock = FakeSender(), ManualClock(START)
    lg = logic(make_settings(), sender, clock)
    lg.on_item(job(Status.SENT))
    sender.answer(500)
    lg.on_notify()
    lg.on_item(job(Status.PROVIDER_ACCEPTED))
    return sender, clock, lg


def test_one_at_a_time_in_status_order_and_a_late_lower_status_is_dropped() -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.DELIVERED))
    lg.on_item(job(Status.SENT))
    assert sender.open == 1 and status_of(sender.requests[0][0]) == "DELIVERED"
    assert sender.answer(200).webhook_id == "wh_msg_a_DELIVERED"
    outs, keep = lg.on_notify()
    assert list(outs) == [] and sender.open == 0 and keep is StatefulLogic.RETAIN
    lg.on_item(job(Status.PROVIDER_ACCEPTED))
    lg.on_item(job(Status.DELIVERED))
    assert sender.open == 0 and not lg.st.pending
    clock.now += lg.policy.memory
    assert lg.on_notify()[1] is StatefulLogic.DISCARD


def test_lower_statuses_queued_behind_a_failing_head_go_first() -> None:
    sender, clock, lg = behind_a_failing_head()
    lg.on_item(job(Status.DELIVERED))
    lg.on_item(job(Status.SENT))
    clock.now += lg.policy.delays[0]
    lg.on_notify()
    assert [status_of(r) for r, _ in sender.requests] == ["SENT", "PROVIDER_ACCEPTED"]
    for expected in ("SENT", "DELIVERED"):
        sender.answer(200)
        clock.now += timedelta(seconds=6)
        lg.on_notify()
        assert status_of(sender.requests[-1][0]) == expected
    sender.answer(200)
    lg.on_notify()
    assert [status_of(r) for r, _ in sender.requests] == [
        "SENT", "PROVIDER_ACCEPTED", "SENT", "DELIVERED"]
    assert {r.webhook_id for r, _ in sender.requests if status_of(r) == "SENT"} == {
        "wh_msg_a_SENT"}


def test_failures_follow_the_schedule_then_dead_letter() -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    policy = lg.policy
    lg.on_item(job(Status.PROVIDER_ACCEPTED))
    start = clock.now
    outs: list[object] = []
    for n in range(1, policy.attempts + 1):
        assert len(sender.requests) == n
        sender.answer(503)
        outs += lg.on_notify()[0]
        if n < policy.attempts:
            due = lg.notify_at()
            assert due is not None
            wait = due - clock.now
            assert policy.delays[n] <= wait <= policy.delays[n] * 1.1
            clock.now += wait - timedelta(milliseconds=1)
            lg.on_notify()
            assert len(sender.requests) == n
            clock.now += timedelta(milliseconds=1)
            lg.on_notify()
    assert clock.now - start >= policy.span
    [dlq] = outs
    assert dlq.error_class == "webhook_exhausted" and dlq.category == "unavailable"
    assert [a.attempt_no for a in dlq.attempts] == list(range(1, 9))
    assert {a.error_code for a in dlq.attempts} == {"503"}
    assert dlq.headers["webhook_id"] == "wh_msg_a_PROVIDER_ACCEPTED"
    payload = orjson.loads(DlqCipher.from_settings(s).decrypt(dlq.payload_encrypted))
    assert payload["url"] == "http://127.0.0.1:9/hook"
    assert orjson.loads(payload["body"])["data"]["status"] == "PROVIDER_ACCEPTED"


def test_open_breaker_delays_without_spending_attempts_until_the_deadline() -> None:
    s = make_settings(schedule=[timedelta(0), timedelta(seconds=1)])
    sender, clock = FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.SENT))
    for _ in range(5):
        sender.answer(Refused(2.0))
        lg.on_notify()
        due = lg.notify_at()
        assert due is not None
        assert timedelta(seconds=2) <= due - clock.now <= timedelta(seconds=2.2)
        clock.now = due
        lg.on_notify()
    assert lg.st.pending[0].tries == 0
    sender.answer(200)
    assert list(lg.on_notify()[0]) == [] and not lg.st.pending
    lg.on_item(job(Status.DELIVERED))
    clock.now += timedelta(hours=1)
    sender.answer(Refused(1.0))
    [dlq] = lg.on_notify()[0]
    assert dlq.error_class == "webhook_exhausted" and dlq.attempts == ()


def test_gone_stops_at_once() -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.SENT))
    sender.answer(410)
    [dlq] = lg.on_notify()[0]
    assert dlq.error_class == "webhook_gone" and len(dlq.attempts) == 1


def test_configuration_problems_dead_letter_without_a_request() -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    [a] = logic(s, sender, clock).on_item(job(Status.SENT, tenant="nosecret"))[0]
    [b] = logic(s, sender, clock).on_item(job(Status.SENT, url="ftp://x/y"))[0]
    assert (a.error_class, b.error_class) == ("webhook_no_secret", "webhook_invalid_url")
    assert a.category == b.category == "invalid_data" and sender.requests == []


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data", "https://10.0.0.7/hook",
    "https://[::ffff:169.254.169.254]/", "https://metadata.google.internal/x",
    "https://2130706433/hook"])
def test_a_url_the_egress_rules_refuse_is_dead_lettered_without_a_request(url: str) -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    [dlq] = logic(s, sender, clock).on_item(job(Status.SENT, url=url))[0]
    assert (dlq.error_class, dlq.category, dlq.tenant_id) == (
        "webhook_url_not_allowed", "invalid_data", "acme")
    assert sender.requests == []


def test_a_url_refused_when_vetted_before_the_post_is_dead_lettered_at_once() -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.SENT, url="https://rebinds.example/hook"))
    sender.answer(AttemptResult(Verdict.REFUSED, "url_not_allowed:not_public", clock.now,
                                clock.now))
    [dlq] = lg.on_notify()[0]
    assert (dlq.error_class, dlq.category) == ("webhook_url_not_allowed", "invalid_data")
    assert dlq.attempts == () and sender.open == 0 and not lg.st.pending


def test_snapshot_resumes_a_pending_retry_and_resends_what_was_in_flight() -> None:
    _, clock, lg = behind_a_failing_head()
    s = lg.settings
    clock.now += timedelta(seconds=6)
    lg.on_notify()
    snap = lg.snapshot()
    assert [p.status for p in snap.pending] == [Status.PROVIDER_ACCEPTED, Status.SENT]
    again = FakeSender()
    resumed = logic(s, again, clock, resume=snap)
    assert resumed.notify_at() is not None and resumed.notify_at() <= clock.now
    resumed.on_notify()
    assert again.requests[0][0].webhook_id == "wh_msg_a_PROVIDER_ACCEPTED"
    again.answer(200)
    resumed.on_notify()
    assert again.requests[1][0].webhook_id == "wh_msg_a_SENT"
    assert resumed.st.pending[0].tries == 1


def test_each_attempt_of_a_per_attempt_status_is_announced() -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.RETRY_PENDING, attempt=1))
    sender.answer(200)
    lg.on_notify()
    lg.on_item(job(Status.RETRY_PENDING, attempt=1))
    lg.on_item(job(Status.RETRY_PENDING, attempt=2))
    sender.answer(200)
    lg.on_notify()
    assert [r.webhook_id for r, _ in sender.requests] == [
        "wh_msg_a_RETRY_PENDING_1", "wh_msg_a_RETRY_PENDING_2"]
    assert [orjson.loads(r.body)["data"]["attempt"] for r, _ in sender.requests] == [1, 2]


def test_a_change_without_url_waits_for_its_message_to_be_known() -> None:
    """A receipt that overtook its message's first event (no row in Cassandra yet) waits in
    the message's key; the event brings the URL and both go out, lowest status first."""
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    outs, keep = lg.on_item(job(Status.DELIVERED, tenant=None, url=None))
    assert list(outs) == [] and keep is StatefulLogic.RETAIN and sender.requests == []
    assert lg.notify_at() == clock.now + lg.policy.park_for
    lg.on_item(job(Status.PROVIDER_ACCEPTED, url="http://127.0.0.1:9/other"))
    sender.answer(200)
    lg.on_notify()
    sender.answer(200)
    lg.on_notify()
    assert [(status_of(r), r.url) for r, _ in sender.requests] == [
        ("PROVIDER_ACCEPTED", "http://127.0.0.1:9/other"),
        ("DELIVERED", "http://127.0.0.1:9/other")]
    lg.on_item(job(Status.CLICKED, tenant=None, url=None))
    sender.answer(200)
    assert status_of(sender.requests[-1][0]) == "CLICKED"


def test_a_change_whose_url_never_becomes_known_is_logged_not_dead_lettered(
        caplog: pytest.LogCaptureFixture) -> None:
    s, sender, clock = make_settings(), FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.SENT, tenant=None, url=None))
    clock.now += lg.policy.park_for
    with caplog.at_level("WARNING"):
        outs, keep = lg.on_notify()
    assert list(outs) == [] and keep is StatefulLogic.DISCARD and sender.requests == []
    assert "not announcing SENT of msg_a" in caplog.text


def test_status_filter_still_learns_the_url_from_unannounced_statuses() -> None:
    s = make_settings(statuses=frozenset({"delivered"}))
    sender, clock = FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.PROVIDER_ACCEPTED))
    lg.on_item(job(Status.SENT, tenant=None, url=None))
    assert sender.requests == []
    lg.on_item(job(Status.DELIVERED, tenant=None, url=None))
    assert [status_of(r) for r, _ in sender.requests] == ["DELIVERED"]


def test_dead_letter_ids_are_deterministic() -> None:
    """An epoch re-run after a crash re-emits the same dead letter, not a second one."""
    s = make_settings(schedule=[timedelta(0)])
    ids = []
    for _ in range(2):
        sender, clock = FakeSender(), ManualClock(START)
        lg = logic(s, sender, clock)
        lg.on_item(job(Status.SENT))
        sender.answer(500)
        [dlq] = lg.on_notify()[0]
        ids.append(dlq.dlq_id)
    assert ids[0] == ids[1]


def test_a_sender_failure_is_a_failed_attempt() -> None:
    s = make_settings(schedule=[timedelta(0), timedelta(seconds=1)])
    sender, clock = FakeSender(), ManualClock(START)
    lg = logic(s, sender, clock)
    lg.on_item(job(Status.SENT))
    _, fut = sender.requests[0]
    fut.set_exception(RuntimeError("boom"))
    assert list(lg.on_notify()[0]) == []
    assert lg.st.pending[0].attempts[0].normalized_error == "internal_error:RuntimeError"
