"""The CHAT channel's rules without I/O: which webhook URLs a chat provider posts to (the
SSRF guard), the recipient's validation and redaction, routing by URL, Slack's and Teams'
wire formats (checked against Slack's own SDK and the Adaptive Card schema) and their
classification tables, and the per-webhook pace (GCRA) reference model."""

from __future__ import annotations

import json
from pathlib import Path

import adaptive_cards
import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from slack_sdk.models.blocks import Block
from slack_sdk.webhook.internal_utils import _build_body

from notiflow.adapters.ports import Slot
from notiflow.adapters.providers.base import OutboundMessage, Outcome
from notiflow.adapters.webhook_pace import decide, interval_us
from notiflow.chat_hooks import parse_prefix, served, slack_escaped, webhook_url
from notiflow.flows.send.routing import rank_routes
from notiflow.providers.slack import classify as slack_classify
from notiflow.providers.slack.client import payload as slack_payload
from notiflow.providers.teams import classify as teams_classify
from notiflow.providers.teams.client import payload as teams_payload
from notiflow.redact import mask
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import SendRequest
from notiflow.settings import PaceRule, Settings

SLACK = ("https://hooks.slack.com/services/",)
TEAMS = Settings().teams.webhook_prefixes
HOOK = "https://hooks.slack.com/services/T0001/B0001/abcdEFGH1234"


@pytest.mark.parametrize(("url", "prefixes", "ok"), [
    (HOOK, SLACK, True),
    ("https://HOOKS.slack.com/services/T/B/x", SLACK, True),
    ("https://hooks.slack.com:443/services/T/B/x", SLACK, True),
    ("https://hooks.slack.com/services", SLACK, False),
    ("https://hooks.slack.com/api/chat.postMessage", SLACK, False),
    ("http://hooks.slack.com/services/T/B/x", SLACK, False),
    ("https://hooks.slack.com:8443/services/T/B/x", SLACK, False),
    ("https://hooks.slack.com.evil.example/services/T/B/x", SLACK, False),
    ("https://evil.example/hooks.slack.com/services/", SLACK, False),
    ("https://hooks.slack.com@evil.example/services/T/B/x", SLACK, False),
    ("https://user:pw@hooks.slack.com/services/T/B/x", SLACK, False),
    ("https://hooks.slack.com/services/../../admin", SLACK, False),
    ("https://hooks.slack.com/services/%2e%2e/admin", SLACK, False),
    ("https://hooks.slack.com/services/a%2Fb", SLACK, False),
    ("https://hooks.slack.com/services/a\\b", SLACK, False),
    ("https://hooks.slack.com/services/T/B/x#frag", SLACK, False),
    ("https://hooks.slack.com/services/T/B/x\n", SLACK, False),
    ("https://127.0.0.1/services/T/B/x", SLACK, False),
    ("https://acme.webhook.office.com/webhookb2/abc/IncomingWebhook/def", TEAMS, True),
    ("https://webhook.office.com/webhookb2/abc", TEAMS, False),
    ("https://acme.webhook.office.com.evil.example/webhookb2/abc", TEAMS, False),
    ("https://prod-12.westus.logic.azure.com:443/workflows/abc/triggers/manual/paths/invoke"
     "?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sig=xyz", TEAMS, True),
    ("https://default1.environment.api.powerplatform.com/powerautomate/automations/direct/"
     "workflows/abc/triggers/manual/paths/invoke?sig=x", TEAMS, True),
    (HOOK, TEAMS, False),
])
def test_which_webhook_urls_a_provider_posts_to(url: str, prefixes: tuple[str, ...],
                                                 ok: bool) -> None:
    assert served(url, prefixes) is ok


@given(host=st.from_regex(r"[a-z0-9.-]{1,40}", fullmatch=True),
       path=st.from_regex(r"/[A-Za-z0-9/_.%-]{0,40}", fullmatch=True),
       scheme=st.sampled_from(["http", "https"]),
       port=st.one_of(st.none(), st.integers(1, 65535)))
def test_a_url_is_served_only_on_the_prefixes_exact_origin(host: str, path: str, scheme: str,
                                                          port: int | None) -> None:
    url = f"{scheme}://{host}{'' if port is None else f':{port}'}{path}"
    if served(url, SLACK):
        assert (scheme, host, port in (None, 443)) == ("https", "hooks.slack.com", True)
        assert path.startswith("/services/") and "/../" not in path + "/"


@pytest.mark.parametrize("prefix", ["https://hooks.slack.com/services/?x=1", "ftp://a.b/",
                                    "https://*.com/", "https://a.b", "https://u@a.b/"])
def test_a_bad_prefix_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError):
        parse_prefix(prefix)
    with pytest.raises(ValidationError):
        Settings(slack={"webhook_prefixes": [prefix]})


def request(recipient: object, **extra: object) -> SendRequest:
    return SendRequest.model_validate({"channel": "CHAT", "tier": "P1",
                                       "recipient": recipient, "template_id": "t",
                                       "template_version": 1, **extra})


def test_a_chat_recipient_is_a_webhook_url() -> None:
    assert request(HOOK).recipient == HOOK
    assert request(HOOK).recipient_key() == HOOK
    for bad in ("hooks.slack.com/services/x", "ftp://hooks.slack.com/services/x",
                "https://u:p@hooks.slack.com/services/x", "https://hooks.slack.com",
                "https:///services/x", "https://hooks.slack.com/services/x#y", "x" * 3000,
                {"device_token": "a" * 64, "platform": "ios"}):
        with pytest.raises(ValidationError):
            request(bad)
    with pytest.raises(ValidationError, match="no sender"):
        request(HOOK, sender="alerts")
    with pytest.raises(ValueError, match="user info"):
        webhook_url("https://a@hooks.slack.com/services/x")


def test_slack_control_characters_in_variables_are_escaped() -> None:
    assert slack_escaped("<!channel> & <http://evil|bank>") \
        == "&lt;!channel&gt; &amp; &lt;http://evil|bank&gt;"


def test_a_webhook_url_is_redacted_to_its_origin() -> None:
    assert mask(HOOK) == "https://hooks.slack.com/…"
    assert "abcd" not in mask(HOOK) and "T0001" not in mask(HOOK)
    assert mask("https://prod.logic.azure.com:443/workflows/a?sig=s3cret") \
        == "https://prod.logic.azure.com:443/…"


def test_chat_routes_follow_the_url() -> None:
    settings = Settings()
    enabled = settings.enabled_providers()
    prefixes = settings.webhook_prefixes()
    assert {"slack", "teams"} <= enabled

    def route(url: str, allowed: frozenset[str] = enabled) -> list[str]:
        return [r.provider_id for r in rank_routes(
            settings.routes, tier=Tier.P0, channel=Channel.CHAT, recipient=url,
            enabled=allowed, prefixes=prefixes)]

    assert route(HOOK) == ["slack"]
    assert route("https://acme.webhook.office.com/webhookb2/x") == ["teams"]
    assert route("https://evil.example/services/x") == []
    assert route(HOOK, enabled - {"slack"}) == []
    assert Settings(slack={"enabled": False}).enabled_providers() >= {"teams"}
    assert "slack" not in Settings(slack={"enabled": False}).enabled_providers()
    assert settings.pace("slack") == PaceRule(rate=1.0, burst=1)
    assert settings.pace("twilio") is None


def message(body: str = "Deploy *done*", subject: str | None = "Release 4.2") -> OutboundMessage:
    return OutboundMessage(message_id="m1", attempt=1, tenant_id="acme", channel=Channel.CHAT,
                           tier=Tier.P1, recipient=HOOK, body=body, subject=subject)


def test_slack_payload_is_what_slacks_sdk_sends_and_its_blocks_parse() -> None:
    doc = slack_payload(message())
    sdk = _build_body({"text": doc["text"], "blocks": doc["blocks"]})
    assert json.loads(json.dumps(sdk)) == doc
    for block in doc["blocks"]:
        parsed = Block.parse(block)
        assert parsed is not None
        parsed.validate_json()
        assert parsed.to_dict() == block
    assert doc["text"] == "*Release 4.2*\nDeploy *done*"


def test_slack_payload_leaves_out_blocks_past_slacks_limits() -> None:
    assert "blocks" not in slack_payload(message(subject="s" * 151))
    assert "blocks" not in slack_payload(message(body="b" * 3001))
    assert "blocks" not in slack_payload(message(subject=None))
    assert slack_payload(message(subject=None)) == {"text": "Deploy *done*"}
    with pytest.raises(Exception, match="150"):
        header = Block.parse({"type": "header", "text": {"type": "plain_text",
                                                          "text": "s" * 151}})
        assert header is not None
        header.validate_json()


def test_teams_card_follows_the_adaptive_card_schema() -> None:
    schema_file = Path(adaptive_cards.__file__).parent / "schemas" / "schema-1.4.json"
    validator = jsonschema.Draft6Validator(json.loads(schema_file.read_text()))
    for m in (message(), message(subject=None), message(body="")):
        doc = teams_payload(m)
        [attachment] = doc["attachments"]
        assert doc["type"] == "message"
        assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
        errors = list(validator.iter_errors(attachment["content"]))
        assert errors == []
    broken = {**teams_payload(message())["attachments"][0]["content"], "body": "nope"}
    assert list(validator.iter_errors(broken))


@pytest.mark.parametrize(("status", "body", "outcome", "reason", "dead"), [
    (400, b"invalid_payload", Outcome.PERMANENT, "invalid_content", False),
    (400, b"no_text", Outcome.PERMANENT, "invalid_content", False),
    (403, b"invalid_token", Outcome.PERMANENT, "invalid_recipient", True),
    (404, b"no_service", Outcome.PERMANENT, "invalid_recipient", True),
    (404, b"channel_not_found", Outcome.PERMANENT, "invalid_recipient", True),
    (410, b"channel_is_archived", Outcome.PERMANENT, "invalid_recipient", True),
    (403, b"team_disabled", Outcome.PERMANENT, "invalid_recipient", True),
    (403, b"action_prohibited", Outcome.PERMANENT, "forbidden", False),
    (403, b"posting_to_general_channel_denied", Outcome.PERMANENT, "forbidden", False),
    (403, b"<html>proxy</html>", Outcome.PERMANENT, "forbidden", False),
    (429, b"rate_limited", Outcome.TRANSIENT, "rate_limited", False),
    (500, b"rollup_error", Outcome.AMBIGUOUS, "server_error", False),
    (503, b"", Outcome.TRANSIENT, "server_error", False),
    (302, b"", Outcome.TRANSIENT, "misconfigured", False),
])
def test_slack_classification(status: int, body: bytes, outcome: Outcome, reason: str,
                              dead: bool) -> None:
    rule = slack_classify.classify_response(status, body)
    assert (rule.outcome, rule.reason, rule.deactivate) == (outcome, reason, dead)


@pytest.mark.parametrize(("status", "code", "outcome", "reason", "dead"), [
    (404, "WorkflowNotFound", Outcome.PERMANENT, "invalid_recipient", True),
    (401, "DirectApiAuthorizationRequired", Outcome.PERMANENT, "invalid_recipient", True),
    (400, "WorkflowTriggerIsNotEnabled", Outcome.PERMANENT, "recipient_disabled", False),
    (400, "TriggerInputSchemaMismatch", Outcome.PERMANENT, "invalid_content", False),
    (400, None, Outcome.PERMANENT, "invalid_content", False),
    (403, None, Outcome.PERMANENT, "invalid_recipient", True),
    (410, None, Outcome.PERMANENT, "invalid_recipient", True),
    (413, "MessageTooLarge", Outcome.PERMANENT, "invalid_content", False),
    (429, "WorkflowRequestsThrottled", Outcome.TRANSIENT, "rate_limited", False),
    (500, None, Outcome.AMBIGUOUS, "server_error", False),
    (502, None, Outcome.TRANSIENT, "server_error", False),
])
def test_teams_classification(status: int, code: str | None, outcome: Outcome, reason: str,
                              dead: bool) -> None:
    rule = teams_classify.classify_response(status, code)
    assert (rule.outcome, rule.reason, rule.deactivate) == (outcome, reason, dead)
    body = {"error": {"code": code, "message": "m"}} if code else {"x": 1}
    assert teams_classify.error_code_of(body) == code


def test_a_teams_connector_reports_refusals_inside_a_200() -> None:
    text = (b"Webhook message delivery failed with error: Microsoft Teams endpoint returned "
            b"HTTP error 429 with ContextId tcid=0,server=msgapi,cv=abc.")
    assert teams_classify.embedded_status(text) == 429
    assert teams_classify.embedded_rule(429).reason == "rate_limited"
    assert teams_classify.embedded_rule(413).reason == "invalid_content"
    assert teams_classify.embedded_status(b"1") is None


RULE = PaceRule(rate=2.0, burst=3)


def run(rule: PaceRule, times: list[int]) -> list[Slot]:
    tat: int | None = None
    slots = []
    for now in times:
        new, slot = decide(tat, now, rule)
        tat = new if new is not None else tat
        slots.append(slot)
    return slots


def test_pace_lets_a_burst_through_then_spaces_posts() -> None:
    t = interval_us(RULE)
    slots = run(RULE, [0] * 6)
    assert [s.wait_us for s in slots] == [0, 0, 0, t, 2 * t, 3 * t]
    assert all(s.reserved for s in slots)
    later = run(RULE, [0, 0, 0, 10 * t])
    assert later[-1] == Slot(0, True)


def test_a_slot_beyond_the_horizon_is_not_taken() -> None:
    rule = PaceRule(rate=1.0, burst=1)
    tat, first = decide(None, 0, rule, horizon_us=2_000_000)
    tats = [tat]
    for _ in range(3):
        tat, _ = decide(tats[-1], 0, rule, horizon_us=2_000_000)
        tats.append(tat if tat is not None else tats[-1])
    assert first.wait_us == 0
    assert decide(tats[-1], 0, rule, horizon_us=2_000_000) == (None, Slot(3_000_000, False))


@given(rate=st.floats(0.1, 50), burst=st.integers(1, 10),
       gaps=st.lists(st.integers(0, 2_000_000), min_size=1, max_size=60))
def test_no_window_holds_more_slots_than_the_rule_allows(rate: float, burst: int,
                                                         gaps: list[int]) -> None:
    rule = PaceRule(rate=rate, burst=burst)
    now, times = 0, []
    for g in gaps:
        now += g
        times.append(now)
    slots = sorted(t + s.wait_us for t, s in zip(times, run(rule, times), strict=True))
    t = interval_us(rule)
    for i, start in enumerate(slots):
        for j in range(i, len(slots)):
            length = slots[j] - start
            assert j - i + 1 <= burst + length // t
