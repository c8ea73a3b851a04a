"""The Vonage classification tables row by row, the answer reader, the request form, the
``client-ref`` correlation and the signature algorithm (pure; no network)."""

from __future__ import annotations

import hashlib
import hmac
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic import SecretStr

from notiflow.adapters.providers.base import DevEndpoints, Outcome
from notiflow.adapters.providers.common import Rule
from notiflow.providers.smtp import dev as smtp_dev
from notiflow.providers.vonage import dev as vonage_dev
from notiflow.providers.vonage.classify import (
    HTTP_STATUSES,
    PARAMETERS,
    STATUS_CLASSES,
    STATUSES,
    UNKNOWN_STATUS,
    classify_http,
    classify_status,
    messages_of,
    parameter_of,
    read_answer,
    throttle_wait,
)
from notiflow.providers.vonage.client import VonageSms, e164_digits
from notiflow.providers.vonage.config import VonageSettings
from notiflow.providers.vonage.receipts import (
    DLR_STATUSES,
    client_ref,
    parse_client_ref,
)
from notiflow.providers.vonage.signature import (
    signature,
    signature_base,
    verify_signature,
)
from notiflow.schemas.enums import Channel, PushPlatform, Status, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
from tests.unit import classification_cases as cases
from tests.unit.classification_cases import A, P, T

EXPECTED_STATUSES: dict[str, tuple[Outcome, str, bool]] = {
    "1": (T, "rate_limited", False),
    "2": (P, "rejected", False),
    "3": (P, "rejected", False),
    "4": (T, "auth_failed", False),
    "5": (T, "server_error", False),
    "6": (P, "unroutable", False),
    "7": (P, "recipient_barred", False),
    "8": (T, "account_inactive", False),
    "9": (T, "quota_exceeded", False),
    "10": (T, "rate_limited", False),
    "11": (T, "misconfigured", False),
    "12": (P, "invalid_content", False),
    "13": (T, "server_error", False),
    "14": (T, "auth_failed", False),
    "15": (T, "misconfigured", False),
    "16": (T, "misconfigured", False),
    "19": (T, "misconfigured", False),
    "20": (T, "misconfigured", False),
    "22": (T, "misconfigured", False),
    "23": (T, "misconfigured", False),
    "29": (P, "unverified_recipient", False),
    "32": (T, "misconfigured", False),
    "33": (P, "deactivated_recipient", True),
    "34": (P, "invalid_recipient", False),
    "101": (P, "unsubscribed", True),
}

EXPECTED_PARAMETERS: dict[str, tuple[Outcome, str]] = {
    "to": (P, "invalid_recipient"),
    "msisdn": (P, "invalid_recipient"),
    "text": (P, "invalid_content"),
    "body": (P, "invalid_content"),
    "udh": (P, "invalid_content"),
    "from": (T, "misconfigured"),
    "api_key": (T, "auth_failed"),
    "api_secret": (T, "auth_failed"),
    "sig": (T, "auth_failed"),
    "timestamp": (T, "auth_failed"),
    "callback": (T, "misconfigured"),
    "client-ref": (T, "misconfigured"),
    "type": (T, "misconfigured"),
    "ttl": (T, "misconfigured"),
    "status-report-req": (T, "misconfigured"),
    "message-class": (T, "misconfigured"),
}


def test_tables_have_exactly_the_reviewed_rows() -> None:
    assert set(STATUSES) == set(EXPECTED_STATUSES)
    assert set(PARAMETERS) == set(EXPECTED_PARAMETERS)
    cases.assert_http_tables(HTTP_STATUSES, STATUS_CLASSES)


@pytest.mark.parametrize(("status", "expected"), sorted(EXPECTED_STATUSES.items()))
def test_status_row(status: str, expected: tuple[Outcome, str, bool]) -> None:
    assert classify_status(status) == Rule(*expected)
    assert classify_status(status, "Some unrelated error text") == Rule(*expected)


@pytest.mark.parametrize(("name", "expected"), sorted(EXPECTED_PARAMETERS.items()))
def test_parameter_row(name: str, expected: tuple[Outcome, str]) -> None:
    assert classify_status("2", f"Missing {name} param") == Rule(*expected)
    assert classify_status("3", f"Invalid {name} param") == Rule(*expected)
    assert classify_status("3", f"Invalid value for parameter `{name}`") == Rule(*expected)


@pytest.mark.parametrize(("text", "name"), [
    ("Missing to param", "to"),
    ("Invalid from param", "from"),
    ("Missing api_key", "api_key"),
    ("Missing api_secret", "api_secret"),
    ("Invalid client-ref param", "client-ref"),
    ("Invalid value for parameter `to`", "to"),
    ("Invalid Parameters", "parameters"),
    ("Bad Credentials", None),
    (None, None),
    ("", None),
])
def test_parameter_of(text: str | None, name: str | None) -> None:
    assert parameter_of(text) == name


def test_parameters_only_refine_statuses_2_and_3() -> None:
    assert classify_status("6", "Invalid to param") == STATUSES["6"]
    assert classify_status("4", "Missing api_key") == STATUSES["4"]
    assert classify_status("3", "Invalid Parameters") == Rule(P, "rejected")
    assert classify_status("2", "Missing Parameters") == Rule(P, "rejected")


@pytest.mark.parametrize("status", ["17", "99", "1000", "", "None", "-1"])
def test_unknown_status_is_transient(status: str) -> None:
    assert classify_status(status) == UNKNOWN_STATUS == Rule(T, "unknown_status")


def test_credentials_and_account_never_fail_a_message() -> None:
    for status in ("4", "8", "9", "11", "14", "15", "32"):
        assert STATUSES[status].outcome is T
    assert all(r.outcome is T for name, r in PARAMETERS.items()
               if name not in ("to", "msisdn", "text", "body", "udh"))


def test_only_dead_or_opted_out_numbers_deactivate() -> None:
    assert {s for s, r in STATUSES.items() if r.deactivate} == {"33", "101"}
    assert not any(r.deactivate for r in PARAMETERS.values())
    assert not any(r.deactivate for r in HTTP_STATUSES.values())


@pytest.mark.parametrize(("status", "expected"), sorted(cases.HTTP_DEFAULT_STATUSES.items()))
def test_http_status_row(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_http(status) == Rule(*expected)


@pytest.mark.parametrize(("status", "expected"),
                         cases.status_class_cases(102, 204, 302, 418, 507, 600))
def test_http_status_class_fallback(status: int, expected: tuple[Outcome, str]) -> None:
    assert classify_http(status) == Rule(*expected)


@pytest.mark.parametrize(("text", "wait"), [
    ("Throughput Rate Exceeded - please wait [ 250 ] and retry", 0.25),
    ("Throughput Rate Exceeded - please wait [7000] and retry", 7.0),
    ("Throttled", None),
    (None, None),
])
def test_throttle_wait(text: str | None, wait: float | None) -> None:
    assert throttle_wait(text) == wait


# answers ------------------------------------------------------------------------------------


def _part(status: str = "0", **kw: str) -> dict[str, str]:
    part = {"status": status, **kw}
    if status == "0":
        part.setdefault("message-id", f"id-{len(kw)}")
    return part


def test_accepted_answer_takes_the_first_part_id() -> None:
    answer = read_answer({"message-count": "2", "messages": [
        _part("0", **{"message-id": "first"}), _part("0", **{"message-id": "second"})]})
    assert (answer.message_id, answer.rule, answer.parts, answer.accepted_parts) == (
        "first", None, 2, 2)


def test_partly_accepted_answer_is_accepted() -> None:
    answer = read_answer({"messages": [_part("0", **{"message-id": "a"}),
                                       _part("5", **{"error-text": "Internal Error"})]})
    assert (answer.message_id, answer.status, answer.accepted_parts) == ("a", "5", 1)


def test_refused_answer_uses_the_first_part() -> None:
    answer = read_answer({"message-count": "1", "messages": [
        {"status": "3", "error-text": "Invalid to param"}]})
    assert (answer.message_id, answer.rule, answer.status) == (
        None, Rule(P, "invalid_recipient"), "3")
    throttled = read_answer({"messages": [
        {"status": "1", "error-text": "Throughput Rate Exceeded - please wait [ 500 ] and retry"}]})
    assert (throttled.rule, throttled.retry_after_s) == (Rule(T, "rate_limited"), 0.5)
    assert read_answer({"messages": [{"status": 4}]}).rule == Rule(T, "auth_failed")


@pytest.mark.parametrize("payload", [
    None, [], {}, {"messages": []}, {"messages": "x"}, {"messages": [{"to": "1"}]},
    {"messages": ["0"]}, {"messages": [{"status": "0"}]},
    {"messages": [{"status": "0", "message-id": ""}]},
])
def test_malformed_answers_are_ambiguous(payload: Any) -> None:
    answer = read_answer(payload)
    assert answer.message_id is None
    assert answer.rule == Rule(A, "malformed_response")


def test_messages_of() -> None:
    assert messages_of({"messages": [{"status": "0"}]}) == [{"status": "0"}]
    assert messages_of({"messages": [{"status": "0"}, {}]}) is None


# request and correlation -------------------------------------------------------------------


def _config(**kw: Any) -> VonageSettings:
    fields: dict[str, Any] = {"api_key": "abcd1234", "api_secret": SecretStr("s3cret")}
    fields.update(kw)
    return VonageSettings(**fields)


_message = partial(cases.outbound, channel=Channel.SMS, attempt=2, tier=Tier.P0,
                   recipient="+447700900123", body="Your code is 123456")


async def test_request_form() -> None:
    async with aiohttp.ClientSession() as session:
        client = VonageSms(_config(from_name="Acme"), session, timeout=1.0)
        assert client.form(_message()) == {
            "api_key": "abcd1234", "api_secret": "s3cret", "from": "Acme",
            "to": "447700900123", "text": "Your code is 123456", "type": "text",
            "client-ref": "msg_1:2"}
        hooked = VonageSms(_config(status_callback_url="https://example.com/dlr"), session,
                           timeout=1.0)
        form = hooked.form(_message(body="Grüße ✓"))
        assert form["type"] == "unicode"
        assert (form["callback"], form["status-report-req"]) == ("https://example.com/dlr", "1")


def _unreachable(session: aiohttp.ClientSession) -> VonageSms:
    return VonageSms(_config(base_url="http://127.0.0.1:9"), session, timeout=1.0)


async def test_push_recipient_is_permanent_without_a_request() -> None:
    token = PushRecipient(device_token="d" * 40, platform=PushPlatform.ANDROID)
    result = await cases.send_once(_unreachable, _message(recipient=token))
    assert (result.outcome, result.reason) == (P, "invalid_recipient")


async def test_connection_refused_is_transient() -> None:
    result = await cases.send_once(_unreachable, _message())
    assert (result.outcome, result.reason) == (T, "connect_error")


async def test_open_requires_key_and_secret() -> None:
    with pytest.raises(ValueError, match="api_key"):
        await VonageSms.open(VonageSettings(), timeout=1.0)
    with pytest.raises(ValueError, match="api_secret"):
        await VonageSms.open(VonageSettings(api_key="k"), timeout=1.0)


def test_vonage_is_enabled_by_key_and_secret() -> None:
    assert "vonage" not in Settings().enabled_providers()
    assert "vonage" not in Settings(vonage=VonageSettings(api_key="k")).enabled_providers()
    assert "vonage" in Settings(vonage=_config()).enabled_providers()


@pytest.mark.parametrize(("number", "digits"), [("+447700900123", "447700900123"),
                                                ("14155550100", "14155550100")])
def test_e164_digits(number: str, digits: str) -> None:
    assert e164_digits(number) == digits


def test_client_ref_round_trip() -> None:
    ref = client_ref("msg_0123456789abcdef0123456789abcdef", 12)
    assert ref == "msg_0123456789abcdef0123456789abcdef:12"
    assert len(ref) <= 100
    assert parse_client_ref(ref) == ("msg_0123456789abcdef0123456789abcdef", 12)


@pytest.mark.parametrize("ref", [None, "", "msg_1", "msg_1:", ":3", "msg_1:x", "msg_1:-1"])
def test_foreign_client_refs(ref: str | None) -> None:
    assert parse_client_ref(ref) is None


def test_dlr_statuses() -> None:
    assert DLR_STATUSES["delivered"] is Status.DELIVERED
    assert {DLR_STATUSES[s] for s in ("failed", "expired", "rejected")} == {Status.FAILED}
    assert DLR_STATUSES["unknown"] is None


# signatures ----------------------------------------------------------------------------------


def documented_base(params: dict[str, str]) -> str:
    """Vonage's documented signing input, written independently of the code under test."""
    out = ""
    for key in sorted(k for k in params if k != "sig"):
        value = params[key].replace("&", "_").replace("=", "_")
        out += "&" + key + "=" + value
    return out


PARAMS = {"msisdn": "447700900123", "to": "Acme", "messageId": "0A0000000123ABCD1",
          "status": "delivered", "err-code": "0", "client-ref": "msg_1:2",
          "message-timestamp": "2024-01-01 10:00:00", "text": "a&b=c", "timestamp": "1700000000",
          "nonce": "f00d"}


def test_signature_base_sorts_and_escapes() -> None:
    base = signature_base({**PARAMS, "sig": "ignored"})
    assert base == documented_base(PARAMS)
    assert "&text=a_b_c" in base and "sig=" not in base


@pytest.mark.parametrize("method", ["md5", "sha1", "sha256", "sha512"])
def test_hmac_signatures(method: str) -> None:
    expected = hmac.new(b"secret", documented_base(PARAMS).encode(), method).hexdigest().upper()
    assert signature("secret", PARAMS, method) == expected  # type: ignore[arg-type]


def test_md5hash_signature() -> None:
    expected = hashlib.md5((documented_base(PARAMS) + "secret").encode()).hexdigest()
    assert signature("secret", PARAMS, "md5hash") == expected


def test_unknown_signature_method() -> None:
    with pytest.raises(ValueError, match="signature method"):
        signature("secret", PARAMS, "sha3")  # type: ignore[arg-type]


def test_verify_signature() -> None:
    now = 1700000010.0
    signed = {**PARAMS, "sig": signature("secret", PARAMS)}
    assert verify_signature("secret", signed, now=now)
    assert verify_signature("secret", {**signed, "sig": signed["sig"].lower()}, now=now)
    assert not verify_signature("other", signed, now=now)
    assert not verify_signature("secret", {**signed, "status": "failed"}, now=now)
    assert not verify_signature("secret", signed, now=now + 301)
    assert not verify_signature("secret", {k: v for k, v in signed.items() if k != "sig"},
                                now=now)
    unstamped = {k: v for k, v in PARAMS.items() if k != "timestamp"}
    assert not verify_signature("secret", {**unstamped, "sig": signature("secret", unstamped)},
                                now=now)
    md5 = {**PARAMS, "sig": signature("secret", PARAMS, "md5hash")}
    assert verify_signature("secret", md5, method="md5hash", now=now)
    assert not verify_signature("secret", md5, now=now)


def test_dev_credentials(tmp_path: Path) -> None:
    endpoints = DevEndpoints.loopback(fakes_port=2, webhook_port=1, apns_port=3, tls_dir=tmp_path)
    env = vonage_dev.environment(endpoints)
    assert env["NOTIFLOW_VONAGE__BASE_URL"] == "http://127.0.0.1:2/vonage"
    assert env["NOTIFLOW_VONAGE__API_KEY"] and env["NOTIFLOW_VONAGE__API_SECRET"]
    assert len(env["NOTIFLOW_VONAGE__SIGNATURE_SECRET"]) >= 32
    assert env["NOTIFLOW_VONAGE__STATUS_CALLBACK_URL"] == "http://127.0.0.1:1/webhooks/vonage"
    assert vonage_dev.environment(endpoints) != env
    smtp = smtp_dev.environment(endpoints)
    assert smtp["NOTIFLOW_FAKES_SMTP_PORT"] == smtp["NOTIFLOW_SMTP__PORT"]
    assert 0 < int(smtp["NOTIFLOW_SMTP__PORT"]) < 65536
    assert smtp["NOTIFLOW_SMTP__USERNAME"] and smtp["NOTIFLOW_SMTP__PASSWORD"]
    assert smtp["NOTIFLOW_SMTP__DSN_WEBHOOK_URL"] == "http://127.0.0.1:1/webhooks/smtp-dsn"
    again = smtp_dev.environment(endpoints)
    assert again["NOTIFLOW_SMTP__PASSWORD"] != smtp["NOTIFLOW_SMTP__PASSWORD"]
