"""The SMTP classification tables row by row (enhanced status codes, reply codes, the stage a
reply answers, transport failures before/after the end of data), the MIME message and its wire
form (pure; no network)."""

from __future__ import annotations

from datetime import UTC, datetime
from email import policy
from email.parser import BytesParser
from functools import partial
from typing import Any

import aiosmtplib
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import Rule
from notiflow.providers.smtp.classify import (
    AUTH,
    CONNECT,
    DATA,
    DATA_END,
    EHLO,
    ENHANCED_CODES,
    ENHANCED_SUBJECTS,
    MAIL,
    RCPT,
    REPLY_CLASSES,
    REPLY_CODES,
    SESSION_CODES,
    SESSION_STAGES,
    STARTTLS,
    TEXT_RULES,
    TRANSPORT_ERRORS,
    classify_failure,
    classify_reply,
    enhanced_code,
    queue_id_of,
    reply_code_text,
)
from notiflow.providers.smtp.client import SmtpEmail
from notiflow.providers.smtp.config import SmtpSettings
from notiflow.providers.smtp.message import (
    Mail,
    build_message,
    message_id_header,
    valid_address,
    wire_bytes,
    xtext,
)
from notiflow.schemas.enums import Channel, PushPlatform
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings
from tests.unit import classification_cases as cases
from tests.unit.classification_cases import A, P, T

EXPECTED_ENHANCED: dict[str, tuple[Outcome, str, bool]] = {
    "5.1.1": (P, "invalid_recipient", True),
    "5.1.2": (P, "invalid_recipient", True),
    "5.1.3": (P, "invalid_recipient", False),
    "5.1.6": (P, "invalid_recipient", True),
    "5.1.10": (P, "invalid_recipient", True),
    "5.2.1": (P, "mailbox_disabled", True),
    "4.2.2": (T, "mailbox_full", False),
    "5.2.2": (T, "mailbox_full", False),
    "5.2.3": (P, "invalid_content", False),
    "5.3.4": (P, "invalid_content", False),
    "5.6.3": (P, "invalid_content", False),
    "5.7.8": (T, "auth_failed", False),
    "4.7.8": (T, "auth_unavailable", False),
    "5.7.9": (T, "misconfigured", False),
    "5.7.11": (T, "misconfigured", False),
    "5.7.23": (T, "misconfigured", False),
    "5.7.25": (T, "misconfigured", False),
    "5.7.26": (T, "misconfigured", False),
}

EXPECTED_SUBJECTS: dict[str, tuple[Outcome, str]] = {
    "4.3": (T, "server_error"),
    "4.4": (T, "server_error"),
    "4.7": (T, "rate_limited"),
    "5.1": (P, "invalid_recipient"),
    "5.2": (P, "mailbox_unavailable"),
    "5.3": (T, "server_error"),
    "5.4": (P, "unroutable"),
    "5.5": (P, "rejected"),
    "5.6": (P, "invalid_content"),
    "5.7": (P, "rejected"),
}

EXPECTED_SESSION_CODES: dict[int, tuple[Outcome, str]] = {
    421: (T, "server_error"),
    454: (T, "auth_unavailable"),
    530: (T, "auth_failed"),
    534: (T, "misconfigured"),
    535: (T, "auth_failed"),
    538: (T, "misconfigured"),
}

EXPECTED_REPLY_CODES: dict[int, tuple[Outcome, str]] = {
    450: (T, "mailbox_unavailable"),
    451: (T, "server_error"),
    452: (T, "server_error"),
    455: (T, "server_error"),
    500: (P, "rejected"),
    501: (P, "rejected"),
    502: (T, "misconfigured"),
    503: (T, "misconfigured"),
    504: (T, "misconfigured"),
    521: (P, "unroutable"),
    550: (P, "mailbox_unavailable"),
    551: (P, "invalid_recipient"),
    552: (T, "mailbox_full"),
    553: (P, "invalid_recipient"),
    554: (P, "rejected"),
    555: (T, "misconfigured"),
    556: (P, "unroutable"),
}


def test_tables_have_exactly_the_reviewed_rows() -> None:
    assert set(ENHANCED_CODES) == set(EXPECTED_ENHANCED)
    assert set(ENHANCED_SUBJECTS) == set(EXPECTED_SUBJECTS)
    assert set(SESSION_CODES) == set(EXPECTED_SESSION_CODES)
    assert set(REPLY_CODES) == set(EXPECTED_REPLY_CODES)
    assert set(REPLY_CLASSES) == {2, 3, 4, 5}
    assert {CONNECT, EHLO, STARTTLS, AUTH, MAIL} == SESSION_STAGES
    assert len(TEXT_RULES) == 1


@pytest.mark.parametrize(("code", "expected"), sorted(EXPECTED_ENHANCED.items()))
def test_enhanced_code_row(code: str, expected: tuple[Outcome, str, bool]) -> None:
    reply = 450 if code.startswith("4") else 550
    for stage in (RCPT, DATA_END, MAIL, AUTH):
        assert classify_reply(reply, f"{code} Something happened", stage) == Rule(*expected)


@pytest.mark.parametrize(("subject", "expected"), sorted(EXPECTED_SUBJECTS.items()))
def test_enhanced_subject_row(subject: str, expected: tuple[Outcome, str]) -> None:
    reply = 451 if subject.startswith("4") else 554
    assert classify_reply(reply, f"{subject}.99 Whatever", RCPT) == Rule(*expected)
    assert classify_reply(reply, f"{subject}.99 Whatever", DATA_END) == Rule(*expected)


@pytest.mark.parametrize(("code", "expected"), sorted(EXPECTED_SESSION_CODES.items()))
def test_session_code_row(code: int, expected: tuple[Outcome, str]) -> None:
    for stage in (CONNECT, AUTH, MAIL, RCPT, DATA, DATA_END):
        assert classify_reply(code, "Go away", stage) == Rule(*expected)


@pytest.mark.parametrize(("code", "expected"), sorted(EXPECTED_REPLY_CODES.items()))
def test_reply_code_row(code: int, expected: tuple[Outcome, str]) -> None:
    assert classify_reply(code, "Refused", RCPT) == Rule(*expected)
    assert classify_reply(code, "Refused", DATA_END) == Rule(*expected)


@pytest.mark.parametrize(("code", "expected"), [
    (220, (A, "unexpected_reply")),
    (354, (A, "unexpected_reply")),
    (471, (T, "server_error")),
    (599, (P, "rejected")),
    (699, (A, "unexpected_reply")),
])
def test_reply_class_fallback(code: int, expected: tuple[Outcome, str]) -> None:
    assert classify_reply(code, "?", DATA_END) == Rule(*expected)


@pytest.mark.parametrize("stage", sorted(SESSION_STAGES))
def test_session_stage_refusals_are_ours(stage: str) -> None:
    assert classify_reply(554, "5.7.1 Client host rejected", stage) == Rule(T, "misconfigured")
    assert classify_reply(550, "Sender address rejected", stage) == Rule(T, "misconfigured")
    assert classify_reply(553, "5.1.7 Bad sender address syntax", stage) == Rule(
        T, "misconfigured")
    assert classify_reply(552, "5.3.4 Message size exceeds fixed limit", stage) == Rule(
        P, "invalid_content")
    assert classify_reply(451, "4.7.1 Slow down", stage) == Rule(T, "rate_limited")


@pytest.mark.parametrize(("code", "text", "stage", "expected"), [
    (550, "5.1.1 <a@b.c>: Recipient address rejected: User unknown", RCPT,
     (P, "invalid_recipient", True)),
    (552, "5.2.2 Mailbox full", RCPT, (T, "mailbox_full", False)),
    (553, "5.1.3 Bad destination mailbox address syntax", RCPT,
     (P, "invalid_recipient", False)),
    (554, "5.7.1 Message rejected: policy", DATA_END, (P, "rejected", False)),
    (535, "5.7.8 Authentication credentials invalid", AUTH, (T, "auth_failed", False)),
    (530, "5.7.0 Authentication required", MAIL, (T, "auth_failed", False)),
    (421, "4.3.2 Service not available", CONNECT, (T, "server_error", False)),
    (451, "4.7.1 Greylisted, please try again later", RCPT, (T, "rate_limited", False)),
    (450, "4.7.1 Too many connections", MAIL, (T, "rate_limited", False)),
    (451, "4.3.0 Error: queue file write error", DATA_END, (T, "server_error", False)),
    (452, "4.3.1 Insufficient system storage", RCPT, (T, "server_error", False)),
    (554, "5.7.1 <a@b.c>: Relay access denied", RCPT, (T, "misconfigured", False)),
    (550, "5.7.26 Unauthenticated email is not accepted", DATA_END,
     (T, "misconfigured", False)),
    (550, "Mailbox unavailable", RCPT, (P, "mailbox_unavailable", False)),
    (554, "No SMTP service here", CONNECT, (T, "misconfigured", False)),
])
def test_typical_replies(code: int, text: str, stage: str,
                         expected: tuple[Outcome, str, bool]) -> None:
    assert classify_reply(code, text, stage) == Rule(*expected)


def test_enhanced_code_must_agree_with_the_reply_class() -> None:
    assert enhanced_code(550, "5.1.1 User unknown") == "5.1.1"
    assert enhanced_code(450, "5.1.1 User unknown") is None
    assert enhanced_code(250, "2.0.0 Ok") == "2.0.0"
    assert enhanced_code(550, "User unknown 5.1.1") is None
    assert enhanced_code(550, "5.1.10 Null MX") == "5.1.10"
    assert classify_reply(450, "5.2.2 Mailbox full", RCPT) == Rule(T, "mailbox_unavailable")


def test_reply_code_text() -> None:
    assert reply_code_text(550, "5.1.1 User unknown") == "550 5.1.1"
    assert reply_code_text(554, "Transaction failed") == "554"


def test_only_hard_bounces_deactivate() -> None:
    deactivating = {c for c, r in ENHANCED_CODES.items() if r.deactivate}
    assert deactivating == {"5.1.1", "5.1.2", "5.1.6", "5.1.10", "5.2.1"}
    for table in (ENHANCED_SUBJECTS, SESSION_CODES, REPLY_CODES, REPLY_CLASSES):
        assert not any(r.deactivate for r in table.values())


# transport -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("exc", "before", "after"), [
    (aiosmtplib.SMTPConnectTimeoutError("x"), (T, "connect_timeout"), (T, "connect_timeout")),
    (aiosmtplib.SMTPConnectError("x"), (T, "connect_error"), (T, "connect_error")),
    (aiosmtplib.SMTPReadTimeoutError("x"), (T, "timeout"), (A, "timeout")),
    (TimeoutError(), (T, "timeout"), (A, "timeout")),
    (ConnectionAbortedError(), (T, "connection_lost"), (A, "connection_lost")),
    (aiosmtplib.SMTPServerDisconnected("x"), (T, "connection_lost"), (A, "connection_lost")),
    (ConnectionResetError(), (T, "connection_lost"), (A, "connection_lost")),
    (OSError("x"), (T, "connection_lost"), (A, "connection_lost")),
    (aiosmtplib.SMTPException("no AUTH"), (T, "misconfigured"), (A, "transport_error")),
    (RuntimeError("bug"), (T, "client_error"), (A, "client_error")),
])
def test_transport_row(exc: BaseException, before: tuple[Outcome, str],
                       after: tuple[Outcome, str]) -> None:
    assert classify_failure(exc, data_sent=False) == Rule(*before)
    assert classify_failure(exc, data_sent=True) == Rule(*after)


def test_transport_table_covers_every_exception() -> None:
    assert TRANSPORT_ERRORS[-1][0] is Exception
    assert classify_failure(KeyboardInterrupt(), data_sent=False) == Rule(T, "client_error")


# replies, message, wire ----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "queue_id"), [
    ("2.0.0 Ok: queued as 3F1A2B4C5D6E", "3F1A2B4C5D6E"),
    ("2.0.0 Ok: queued as <4Xyz12AbCdefGh>", "4Xyz12AbCdefGh"),
    ("OK id=1rAbCd-000123-4E", "1rAbCd-000123-4E"),
    ("Ok 0100018c1d2e3f40-1a2b3c4d-aaaa-bbbb-cccc-0123456789ab-000000",
     "0100018c1d2e3f40-1a2b3c4d-aaaa-bbbb-cccc-0123456789ab-000000"),
    ("2.0.0 OK 1700000000 x12-20020a05600c000000b00000000000sm00000gsm.42 - gsmtp", None),
    ("Ok", None),
])
def test_queue_id_of(text: str, queue_id: str | None) -> None:
    assert queue_id_of(text) == queue_id


def test_xtext() -> None:
    assert xtext("msg_0123abc.2") == "msg_0123abc.2"
    assert xtext("a+b=c d") == "a+2Bb+3Dc+20d"
    assert xtext("é") == "+C3+A9"


@pytest.mark.parametrize(("address", "valid"), [
    ("ada@example.com", True), ("a.b+tag@sub.example.co", True), ("ü@exämple.com", True),
    ("no-at-sign", False), ("a@b@c", False), ("a b@example.com", False),
    ("<a@example.com>", False), ("a@example.com\r\nRCPT TO:<x@y.z>", False), ("", False),
])
def test_valid_address(address: str, valid: bool) -> None:
    assert valid_address(address) is valid


_message = partial(cases.outbound, channel=Channel.EMAIL, attempt=3,
                   recipient="ada@example.com", body="Hello\n.hidden\nbye", subject="Grüße")


NOW = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)


def _parsed(mail: Mail, utf8: bool = False) -> Any:
    raw = wire_bytes(mail, utf8=utf8)
    return BytesParser(policy=policy.default).parsebytes(raw[:-3].replace(b"\r\n..", b"\r\n."))


def test_message_headers_read_back_by_a_standard_parser() -> None:
    mail = build_message(_message(), sender="notifications@example.com", now=NOW)
    assert mail["Subject"] == "Grüße" and "Subject" in mail
    parsed = _parsed(mail)
    assert parsed["From"] == "notifications@example.com"
    assert parsed["To"] == "ada@example.com"
    assert parsed["Subject"] == "Grüße"
    assert parsed["Message-ID"] == "<msg_1.3@notiflow>" == message_id_header("msg_1", 3)
    assert parsed["X-Notiflow-Message-Id"] == "msg_1"
    assert parsed["X-Notiflow-Attempt"] == "3"
    assert parsed["Date"] == "Mon, 06 May 2024 07:08:09 +0000"
    assert parsed["MIME-Version"] == "1.0"
    assert parsed.get_content_type() == "text/plain"
    assert parsed.get_content_charset() == "utf-8"
    no_subject = build_message(_message(subject=None), sender="n@example.com", now=NOW)
    assert "Subject" not in no_subject and "Subject" not in _parsed(no_subject)


@given(st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=300),
       st.text(st.characters(blacklist_categories=("Cs",)), max_size=3000))
def test_any_subject_and_body_survive_the_wire(subject: str, body: str) -> None:
    mail = build_message(_message(subject=subject, body=body), sender="n@example.com",
                         now=NOW)
    raw = wire_bytes(mail, utf8=False)
    assert raw.isascii() and raw.endswith(b"\r\n.\r\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert max(len(line) for line in raw.split(b"\r\n")) <= 998
    parsed = _parsed(mail)
    assert " ".join((parsed["Subject"] or "").split()) == " ".join(subject.split())
    text = body.replace("\r\n", "\n").replace("\r", "\n")
    expected = text if text.endswith("\n") else text + "\n"
    assert parsed.get_content().replace("\r\n", "\n") == expected


def test_utf8_headers_go_raw_when_smtputf8_was_negotiated() -> None:
    mail = build_message(_message(recipient="用户@例子.广告"), sender="n@example.com", now=NOW)
    raw = wire_bytes(mail, utf8=True)
    assert "To: 用户@例子.广告\r\n".encode() in raw
    assert "Subject: Grüße\r\n".encode() in raw


def test_header_injection_is_refused() -> None:
    with pytest.raises(ValueError):
        build_message(_message(subject="Hi\r\nBcc: eve@example.com"), sender="n@example.com",
                      now=NOW)


def test_wire_bytes_are_dot_stuffed_and_terminated() -> None:
    mail = build_message(_message(), sender="n@example.com", now=NOW)
    raw = wire_bytes(mail, utf8=False)
    assert raw.endswith(b"\r\n.\r\n")
    assert raw.isascii()
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert b"=?utf-8?" in raw
    unstuffed = raw[:-3].replace(b"\r\n..", b"\r\n.")
    parsed = BytesParser(policy=policy.default).parsebytes(unstuffed)
    assert parsed.get_content().replace("\r\n", "\n") == "Hello\n.hidden\nbye\n"
    assert parsed["Subject"] == "Grüße"


async def test_invalid_recipients_fail_without_connecting() -> None:
    client = SmtpEmail(SmtpSettings(port=9), timeout=1.0)
    for recipient in ("not-an-address",
                      PushRecipient(device_token="d" * 40, platform=PushPlatform.ANDROID)):
        result = await client.send(_message(recipient=recipient))
        assert (result.outcome, result.reason, result.error_code) == (
            P, "invalid_recipient", "address")
    assert client.stats.opened == 0
    await client.aclose()


async def test_connection_refused_is_transient() -> None:
    client = await SmtpEmail.open(SmtpSettings(port=9), timeout=1.0)
    result = await client.send(_message())
    await client.aclose()
    assert (result.outcome, result.reason) == (T, "connect_error")
    assert result.error_code == "connect:SMTPConnectError"


async def test_open_validates_credentials() -> None:
    with pytest.raises(ValueError, match="password"):
        await SmtpEmail.open(SmtpSettings(username="u"), timeout=1.0)
    client = await SmtpEmail.open(
        Settings(smtp=SmtpSettings(username="u", password=SecretStr("p"))), timeout=1.0)
    assert client.provider_id == "smtp" and client.channel is Channel.EMAIL
    await client.aclose()


def test_smtp_is_enabled_by_username_and_password() -> None:
    assert "smtp" not in Settings().enabled_providers()
    assert "smtp" not in Settings(smtp=SmtpSettings(username="u")).enabled_providers()
    on = Settings(smtp=SmtpSettings(username="u", password=SecretStr("p")))
    assert "smtp" in on.enabled_providers()
