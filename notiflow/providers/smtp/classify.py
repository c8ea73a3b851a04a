"""How SMTP replies and transport failures are classified: RFC 3463 enhanced status codes
(:data:`ENHANCED_CODES`, then :data:`ENHANCED_SUBJECTS`), reply codes (:data:`SESSION_CODES`,
:data:`REPLY_CODES`, :data:`REPLY_CLASSES`), the command the reply answered
(:data:`SESSION_STAGES`), a few reply texts (:data:`TEXT_RULES`), and :data:`TRANSPORT_ERRORS`,
whose outcome depends on whether the end-of-data terminator was written: before it nothing can
have been accepted (TRANSIENT), after it the server may have queued the message (AMBIGUOUS).
``docs/providers.md`` explains each row. Also where a ``250`` names the server's queue id.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import aiosmtplib

from notiflow.adapters.providers.base import Outcome
from notiflow.adapters.providers.common import Rule, matching_row

_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

# Stages: the command a reply answers. "data_end" is the reply to the end-of-data terminator.
CONNECT, EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA, DATA_END = (
    "connect", "ehlo", "starttls", "auth", "mail", "rcpt", "data", "data_end")

SESSION_STAGES: Final = frozenset({CONNECT, EHLO, STARTTLS, AUTH, MAIL})
"""Stages whose permanent (5xx) refusal is about our session — the relay, our credentials,
our sender — never about the message or its recipient: TRANSIENT ``misconfigured`` unless an
exact enhanced code or a :data:`SESSION_CODES` row says more."""
SESSION_REFUSED: Final = Rule(_T, "misconfigured")

TEXT_RULES: Final[tuple[tuple[re.Pattern[str], Rule], ...]] = (
    (re.compile(r"relay(ing)?\s+(access\s+)?(denied|not\s+permitted)", re.IGNORECASE),
     Rule(_T, "misconfigured")),
)
"""Reply text → rule; consulted first. A relay that refuses to relay for us is our
configuration, whatever code it uses (Postfix: ``554 5.7.1 ... Relay access denied``)."""

ENHANCED_CODES: Final[Mapping[str, Rule]] = {
    "5.1.1": Rule(_P, "invalid_recipient", deactivate=True),
    "5.1.2": Rule(_P, "invalid_recipient", deactivate=True),
    "5.1.3": Rule(_P, "invalid_recipient"),
    "5.1.6": Rule(_P, "invalid_recipient", deactivate=True),
    "5.1.10": Rule(_P, "invalid_recipient", deactivate=True),
    "5.2.1": Rule(_P, "mailbox_disabled", deactivate=True),
    "4.2.2": Rule(_T, "mailbox_full"),
    "5.2.2": Rule(_T, "mailbox_full"),
    "5.2.3": Rule(_P, "invalid_content"),
    "5.3.4": Rule(_P, "invalid_content"),
    "5.6.3": Rule(_P, "invalid_content"),
    "5.7.8": Rule(_T, "auth_failed"),
    "4.7.8": Rule(_T, "auth_unavailable"),
    "5.7.9": Rule(_T, "misconfigured"),
    "5.7.11": Rule(_T, "misconfigured"),
    "5.7.23": Rule(_T, "misconfigured"),
    "5.7.25": Rule(_T, "misconfigured"),
    "5.7.26": Rule(_T, "misconfigured"),
}
"""RFC 3463 enhanced status code → rule (exact match). Hard bounces (no such mailbox or domain,
moved, null MX, disabled) deactivate the recipient; a bad address syntax fails the message
only. A full mailbox (5.2.2) is treated as a soft bounce. Authentication, encryption and
sender-authentication (SPF 5.7.23, reverse DNS 5.7.25, DMARC 5.7.26) failures are ours."""

ENHANCED_SUBJECTS: Final[Mapping[str, Rule]] = {
    "4.3": Rule(_T, "server_error"),
    "4.4": Rule(_T, "server_error"),
    "4.7": Rule(_T, "rate_limited"),
    "5.1": Rule(_P, "invalid_recipient"),
    "5.2": Rule(_P, "mailbox_unavailable"),
    "5.3": Rule(_T, "server_error"),
    "5.4": Rule(_P, "unroutable"),
    "5.5": Rule(_P, "rejected"),
    "5.6": Rule(_P, "invalid_content"),
    "5.7": Rule(_P, "rejected"),
}
"""Enhanced ``class.subject`` → rule, for codes without an exact row: 4.7.x (throttling,
greylisting, temporary policy) is ``rate_limited``; 5.3.x is the server's own mail system
(TRANSIENT); 5.7.x is a policy rejection of the message."""

SESSION_CODES: Final[Mapping[int, Rule]] = {
    421: Rule(_T, "server_error"),
    454: Rule(_T, "auth_unavailable"),
    530: Rule(_T, "auth_failed"),
    534: Rule(_T, "misconfigured"),
    535: Rule(_T, "auth_failed"),
    538: Rule(_T, "misconfigured"),
}
"""Reply codes that describe the session whatever the command (service closing, AUTH needed,
refused or unavailable); consulted after :data:`ENHANCED_CODES`."""

REPLY_CODES: Final[Mapping[int, Rule]] = {
    450: Rule(_T, "mailbox_unavailable"),
    451: Rule(_T, "server_error"),
    452: Rule(_T, "server_error"),
    455: Rule(_T, "server_error"),
    500: Rule(_P, "rejected"),
    501: Rule(_P, "rejected"),
    502: Rule(_T, "misconfigured"),
    503: Rule(_T, "misconfigured"),
    504: Rule(_T, "misconfigured"),
    521: Rule(_P, "unroutable"),
    550: Rule(_P, "mailbox_unavailable"),
    551: Rule(_P, "invalid_recipient"),
    552: Rule(_T, "mailbox_full"),
    553: Rule(_P, "invalid_recipient"),
    554: Rule(_P, "rejected"),
    555: Rule(_T, "misconfigured"),
    556: Rule(_P, "unroutable"),
}
"""Reply code → rule, for replies no enhanced code decided. A bare 550 is not proof that the
mailbox is gone (it is also used for policy refusals): it fails the message without
deactivating the recipient."""

REPLY_CLASSES: Final[Mapping[int, Rule]] = {
    2: Rule(_A, "unexpected_reply"),
    3: Rule(_A, "unexpected_reply"),
    4: Rule(_T, "server_error"),
    5: Rule(_P, "rejected"),
}
"""``code // 100`` → rule; the last resort (SMTP: 4xx transient, 5xx permanent)."""

QUEUE_ID_PATTERNS: Final[tuple[re.Pattern[str], ...]] = (
    re.compile(r"queued\s+as\s+<?([\w.@-]+)>?", re.IGNORECASE),
    re.compile(r"\bid=([\w.-]+)"),
    re.compile(r"^(?:2\.\d{1,3}\.\d{1,3}\s+)?ok\s+([\w.-]{16,})\s*$", re.IGNORECASE),
)
"""Where a ``250`` reply to the end of data names the server's queue id (Postfix ``queued as
X``, Exim ``id=X``, SES ``Ok X``); the first match wins."""

_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})(?=\s|$)")


@dataclass(frozen=True, slots=True)
class TransportRule:
    """A transport failure's rule before and after the end-of-data terminator was written."""

    before: Rule
    after: Rule


TRANSPORT_ERRORS: Final[tuple[tuple[type[BaseException], TransportRule], ...]] = (
    (aiosmtplib.SMTPConnectTimeoutError,
     TransportRule(Rule(_T, "connect_timeout"), Rule(_T, "connect_timeout"))),
    (aiosmtplib.SMTPConnectError,
     TransportRule(Rule(_T, "connect_error"), Rule(_T, "connect_error"))),
    (TimeoutError, TransportRule(Rule(_T, "timeout"), Rule(_A, "timeout"))),
    (ConnectionError, TransportRule(Rule(_T, "connection_lost"), Rule(_A, "connection_lost"))),
    (OSError, TransportRule(Rule(_T, "connection_lost"), Rule(_A, "connection_lost"))),
    (aiosmtplib.SMTPException,
     TransportRule(Rule(_T, "misconfigured"), Rule(_A, "transport_error"))),
    (Exception, TransportRule(Rule(_T, "client_error"), Rule(_A, "client_error"))),
)
"""Exception type → rule pair, first ``isinstance`` match wins (aiosmtplib's timeouts are
``TimeoutError``, its disconnects ``ConnectionError``). An ``SMTPException`` without a reply
is a capability mismatch (no AUTH offered, STARTTLS unavailable): our configuration."""


def enhanced_code(code: int, text: str) -> str | None:
    """The RFC 3463 enhanced status code that starts ``text``, if its class agrees with the
    reply ``code``."""
    match = _ENHANCED.match(text.lstrip())
    if match is None or int(match.group(1)) != code // 100:
        return None
    return ".".join(match.groups())


def classify_reply(code: int, text: str, stage: str = DATA_END) -> Rule:
    """The rule for a refusing reply at ``stage``: :data:`TEXT_RULES`, exact enhanced code,
    :data:`SESSION_CODES`, the session-stage rule (5xx), enhanced subject, reply code, reply
    class."""
    for pattern, rule in TEXT_RULES:
        if pattern.search(text):
            return rule
    enhanced = enhanced_code(code, text)
    if enhanced is not None and (found := ENHANCED_CODES.get(enhanced)) is not None:
        return found
    if (found := SESSION_CODES.get(code)) is not None:
        return found
    if stage in SESSION_STAGES and code // 100 == 5:
        return SESSION_REFUSED
    if enhanced is not None:
        subject = enhanced.rsplit(".", 1)[0]
        if (found := ENHANCED_SUBJECTS.get(subject)) is not None:
            return found
    if (found := REPLY_CODES.get(code)) is not None:
        return found
    return REPLY_CLASSES.get(code // 100, Rule(_A, "unexpected_reply"))


def classify_failure(exc: BaseException, *, data_sent: bool) -> Rule:
    """The rule for a transport failure (see :data:`TRANSPORT_ERRORS`)."""
    pair = matching_row(exc, TRANSPORT_ERRORS)
    if pair is not None:
        return pair.after if data_sent else pair.before
    return Rule(_A, "client_error") if data_sent else Rule(_T, "client_error")


def queue_id_of(text: str) -> str | None:
    """The queue id a ``250`` reply names (see :data:`QUEUE_ID_PATTERNS`)."""
    for pattern in QUEUE_ID_PATTERNS:
        match = pattern.search(text)
        if match:
            return match.group(1)
    return None


def reply_code_text(code: int, text: str) -> str:
    """``error_code`` of a refusing reply: the reply code and the enhanced code, if any
    (``"550 5.1.1"``)."""
    enhanced = enhanced_code(code, text)
    return f"{code} {enhanced}" if enhanced else str(code)
