"""The served ``/openapi.json`` against the real API process: schemathesis with every check
(examples, coverage and fuzzing phases per operation, then the stateful phase along the
document's links), authenticated as a tenant.

Schema-valid requests may be refused only for the rules the document names as not stated
by the schema (stored state, the clock, the deployment): the built-in
``positive_data_acceptance`` is told that 422 can be such a refusal, and
:func:`refusal_names_a_documented_rule` then checks that every 4xx refusal of a schema-valid
request names one of those rules, never a schema failure.

``use_after_free`` is off: none of the API's ``DELETE`` operations removes what it names (a
message is cancelled and reads back ``CANCELLED``, a device token is deactivated, a schedule
is stopped with state ``deleted``), so a ``GET`` after it answers 200 by contract (the
stateful phase found a cancel followed by a read once in CI)."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import httpx
import phonenumbers
import pytest
import schemathesis
from hypothesis import strategies as st
from pydantic import ValidationError
from schemathesis import engine
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events

from notiflow.schemas.messages import SendRequest

MAX_EXAMPLES = 20

TEMPLATES = [
    ("contract-sms", "SMS", "hello"), ("contract-email", "EMAIL", "hello"),
    ("contract-push", "PUSH", "hello"), ("contract-chat", "CHAT", "hello"),
    ("contract-inapp", "INAPP", "hello"),
    ("otp", "SMS", "Your code is {{ code }}"),
    ("weekly-digest", "EMAIL", "Hi {{ name }}"), ("order-shipped", "PUSH", "{{ order }}"),
    ("winter", "SMS", "Hi {{ name }}"),
]
"""Every template the document's examples name, and one per channel without variables that
generated send requests are pointed at (so they reach acceptance and the links)."""

STATE_RULES = frozenset({
    "unknown_template", "missing_template_variable", "channel_unavailable",
    "variables_too_large", "expired", "scheduled_too_far", "invalid_since", "invalid_cursor",
    "template_syntax_error", "invalid_schedule", "invalid_device_token", "rate_too_high",
    "quota_too_large", "window_too_long", "window_over", "manifest_unreadable",
    "manifest_not_allowed", "not_a_dsn",
    "uncorrelated_dsn", "unknown_callback", "unknown_receipt", "invalid_batch",
    "recipient_not_served", "inbox_not_configured", "category_tier_not_allowed",
    "webhook_url_not_allowed", "template_refused", "unknown_user",
    "locale_variables_differ", "locale_subject_differs",
})
"""The 422/400 reasons the document lists as rules the schema does not state."""
NOT_STATED = ("scheduled_at must be before expires_at", "ends_at must be after starts_at",
              "window start and end must differ", "not a valid number for its country code",
              "a webhook URL", "email addresses are listed once each",
              "properties take at most", "each channel is listed once",
              "each locale is listed once", "each user is listed once")
"""Schema failures the document names as beyond JSON Schema: rules between two fields,
libphonenumber's validity of a number for its country (``format: e164``; the coverage
phase builds numbers from the pattern alone), a webhook URL's rules beyond its pattern
(host labels, port range, dot segments, encoded slashes: ``chat_hooks.webhook_url``), a
user's email addresses compared case-insensitively, and the size of a user's properties as
JSON."""


def _phone_numbers() -> list[str]:
    out = set()
    for region in phonenumbers.SUPPORTED_REGIONS:
        for kind in (phonenumbers.PhoneNumberType.MOBILE,
                     phonenumbers.PhoneNumberType.FIXED_LINE):
            n = phonenumbers.example_number_for_type(region, kind)
            if n is not None:
                out.add(phonenumbers.format_number(n, phonenumbers.PhoneNumberFormat.E164))
    return sorted(out)


schemathesis.openapi.format("e164", st.sampled_from(_phone_numbers()))
schemathesis.serializer.alias(["message/rfc822", "multipart/report"], "text/plain")


@schemathesis.check
def refusal_names_a_documented_rule(ctx: Any, response: Any, case: Any) -> bool | None:
    """A schema-valid request refused with 400/422 names a rule the document lists as not
    stated by the schema."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if response.status_code not in (400, 422) or not _path_sent_as_generated(case):
        return None
    body = response.json()
    reason = body.get("reason")
    if reason in STATE_RULES:
        return None
    details = body.get("details") or []
    if reason in ("invalid_body", "invalid_recipient") and details and all(
            any(rule in d.get("msg", "") for rule in NOT_STATED) for d in details):
        return None
    raise AssertionError(f"schema-valid request refused: {response.status_code} {body}")


def _path_sent_as_generated(case: Any) -> bool:
    """Whether every path parameter the API received (the sent value, percent-decoded)
    is still schema-valid: schemathesis unquotes a generated value before quoting it, so a
    generated ``%5D`` reaches the API as ``]``, which the schema does not allow."""
    sent = case.path_parameters or {}
    return all(p.is_valid(unquote(str(sent[p.name])))
               for p in case.operation.path_parameters if p.name in sent)


def _seed(api: str, token: str) -> None:
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"},
                      timeout=30) as http:
        for template_id, channel, text in TEMPLATES:
            r = http.post("/v1/templates", json={"template_id": template_id, "channel": channel,
                                                 "version": 1, "body": text})
            assert r.status_code in (200, 201), r.text


@pytest.fixture(scope="module")
def contract_schema(api: str, tokens: dict[str, str]) -> Any:
    token = tokens["acme"]
    _seed(api, token)
    config = SchemathesisConfig.from_dict({
        "headers": {"Authorization": f"Bearer {token}"},
        "generation": {"max-examples": MAX_EXAMPLES},
        "checks": {"positive_data_acceptance": {"expected-statuses": [
            "2xx", "401", "403", "404", "409", "422", "429"]},
                   "use_after_free": {"enabled": False}},
    })
    schema = schemathesis.openapi.from_url(f"{api}/openapi.json", config=config)

    @schema.hook("map_body")
    def seeded_template(context: Any, body: Any) -> Any:
        """A schema-valid send request names the template of its channel seeded above."""
        if context.operation is None or context.operation.label != "POST /v1/messages":
            return body
        try:
            req = SendRequest.model_validate(body)
        except ValidationError:
            return body
        return {**body, "template_id": f"contract-{req.channel.value.lower()}",
                "template_version": 1}

    return schema


def _failures(schema: Any) -> tuple[list[str], dict[str, int]]:
    """Run every phase (examples, coverage, fuzzing, stateful) the way ``st run`` does;
    the failed checks and errors, and how many scenarios each phase ran."""
    failures: list[str] = []
    scenarios: dict[str, int] = {}
    for event in engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            scenarios[event.phase.value] = scenarios.get(event.phase.value, 0) + 1
            for checks in event.recorder.checks.values():
                failures.extend(
                    f"{event.phase.value} {event.label}: {c.name}: "
                    f"{c.failure_info.failure.title} {c.failure_info.failure.message}"
                    for c in checks if c.status is Status.FAILURE and c.failure_info)
        elif isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(f"error {getattr(event, 'label', '')}: {event.info}")
    return failures, scenarios


def test_every_operation_and_link_keeps_its_contract(contract_schema: Any) -> None:
    failures, scenarios = _failures(contract_schema)
    assert not failures, "\n".join(sorted(set(failures)))
    assert scenarios.get("stateful"), scenarios
