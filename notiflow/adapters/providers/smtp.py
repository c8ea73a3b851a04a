"""SMTP (email) adapter over ``aiosmtplib``: a relay reached with ESMTP, optional STARTTLS and
AUTH (CRAM-MD5, PLAIN or LOGIN, in that order among the mechanisms the server offers).

Each message is one transaction on a pooled connection: ``MAIL FROM:<from_email>`` (with
``ENVID={message_id}.{attempt}`` when the server offers DSN), ``RCPT TO:<recipient>``,
``DATA`` and a MIME message (:func:`wire_bytes`): ``From``, ``To``, ``Subject``, ``Date``,
``Message-ID: <{message_id}.{attempt}@notiflow>``, ``X-Notiflow-Message-Id`` and
``X-Notiflow-Attempt``, a quoted-printable ``text/plain; charset=utf-8`` body.
A ``250`` after the end-of-data terminator is the acceptance; ``provider_message_id`` is the
queue id the reply names (``queued as ...``), else the Message-ID.

Replies are classified by the data tables below — RFC 3463 enhanced status codes
(:data:`ENHANCED_CODES`, then :data:`ENHANCED_SUBJECTS`), reply codes (:data:`SESSION_CODES`,
:data:`REPLY_CODES`, :data:`REPLY_CLASSES`), the command the reply answered
(:data:`SESSION_STAGES`), a few reply texts (:data:`TEXT_RULES`) — and transport failures by
:data:`TRANSPORT_ERRORS`, whose outcome depends on whether the end-of-data terminator was
written: before it nothing can have been accepted (TRANSIENT), after it the server may have
queued the message (AMBIGUOUS). ``docs/providers.md`` explains each row. SMTP has no
idempotency key; the Message-ID and ENVID correlate later bounces (DSNs) with the attempt.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import logging
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.header import Header
from email.utils import format_datetime
from typing import Final

import aiosmtplib

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import Rule, seconds, utcnow
from notiflow.redact import mask
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings, SmtpSettings

log = logging.getLogger(__name__)

MESSAGE_ID_DOMAIN: Final = "notiflow"
MESSAGE_ID_HEADER: Final = "X-Notiflow-Message-Id"
ATTEMPT_HEADER: Final = "X-Notiflow-Attempt"

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
_ADDRESS = re.compile(r"[^@\s<>()\[\],;:\"\\]+@[^@\s<>()\[\],;:\"\\]+")


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
    for kind, pair in TRANSPORT_ERRORS:
        if isinstance(exc, kind):
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


def message_id_header(message_id: str, attempt: int) -> str:
    """The ``Message-ID`` of one attempt: ``<{message_id}.{attempt}@notiflow>``."""
    return f"<{message_id}.{attempt}@{MESSAGE_ID_DOMAIN}>"


def xtext(value: str) -> str:
    """RFC 3461 xtext (``ENVID``): ``+XX`` for ``+``, ``=`` and anything outside ``!``..``~``."""
    return "".join(c if "!" <= c <= "~" and c not in "+=" else
                   "".join(f"+{b:02X}" for b in c.encode()) for c in value)


def valid_address(address: str) -> bool:
    """True for one plain ``local@domain`` address without spaces, brackets or controls."""
    return bool(_ADDRESS.fullmatch(address)) and address.isprintable()


@dataclass(frozen=True, slots=True)
class Mail:
    """One attempt's message: header values as given (rendered by :func:`wire_bytes`) and a
    plain-text body. Built by hand rather than with ``email.message.EmailMessage``, which
    cost ≈ 0.7 ms per message (the send flow's top hotspot in ``notiflow bench
    throughput``); the output is the same MIME a standard parser reads back."""

    headers: tuple[tuple[str, str], ...]
    body: str

    def __getitem__(self, name: str) -> str | None:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), None)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self[name] is not None


_ADDRESS_HEADERS = frozenset({"from", "to"})


def build_message(message: OutboundMessage, *, sender: str, now: datetime) -> Mail:
    """The message of one attempt; ``ValueError`` when a header value holds a line break
    (header injection)."""
    headers = [("From", sender), ("To", str(message.recipient))]
    if message.subject is not None:
        headers.append(("Subject", message.subject))
    headers += [("Date", format_datetime(now)),
                ("Message-ID", message_id_header(message.message_id, message.attempt)),
                (MESSAGE_ID_HEADER, message.message_id),
                (ATTEMPT_HEADER, str(message.attempt))]
    for name, value in headers:
        if "\r" in value or "\n" in value:
            raise ValueError(f"{name} header holds a line break")
    return Mail(tuple(headers), message.body)


def _header(name: str, value: str, utf8: bool) -> bytes:
    if value.isascii() and len(name) + len(value) < 996:
        return f"{name}: {value}\r\n".encode()
    if utf8 or name.lower() in _ADDRESS_HEADERS:
        return f"{name}: {value}\r\n".encode()
    folded = Header(value, "utf-8" if not value.isascii() else "us-ascii",
                    header_name=name).encode(linesep="\r\n")
    return f"{name}: {folded}\r\n".encode()


_MIME = (b"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=\"utf-8\"\r\n"
         b"Content-Transfer-Encoding: quoted-printable\r\n\r\n")


def wire_bytes(mail: Mail, *, utf8: bool) -> bytes:
    """``mail`` as DATA content: CRLF line ends, quoted-printable UTF-8 body, dot-stuffed,
    followed by the terminator. ``utf8``: SMTPUTF8 was negotiated (UTF-8 header values are
    sent as they are; otherwise they are RFC 2047 encoded)."""
    head = b"".join(_header(k, v, utf8) for k, v in mail.headers)
    text = mail.body.replace("\r\n", "\n").replace("\r", "\n")
    if not text.endswith("\n"):
        text += "\n"
    body = binascii.b2a_qp(text.encode(), istext=True).replace(b"\n", b"\r\n")
    raw = head + _MIME + body
    return re.sub(rb"(?m)^\.", b"..", raw) + b".\r\n"


class _Refused(Exception):
    """A refusing reply at a stage."""

    def __init__(self, stage: str, code: int, text: str) -> None:
        super().__init__(f"{stage}: {code} {text}")
        self.stage = stage
        self.code = code
        self.text = text


@dataclass(slots=True)
class _Connection:
    smtp: aiosmtplib.SMTP
    last_used: float
    sent: int = 0


@dataclass(slots=True)
class _Progress:
    stage: str = CONNECT
    data_sent: bool = False
    reused: bool = False


@dataclass(slots=True)
class PoolStats:
    """Connection counters (for tests and metrics)."""

    opened: int = 0
    reused: int = 0
    discarded: int = 0
    retired: int = 0
    stale_retries: int = 0


class SmtpEmail:
    """One SMTP relay account as a :class:`~notiflow.adapters.providers.base.ProviderClient`.

    Up to ``max_connections`` connections are opened lazily and reused for consecutive
    messages (one transaction at a time each). A pooled connection is retired after
    ``max_messages_per_connection`` messages or ``idle_timeout`` seconds unused. ``send``
    never raises for replies or transport failures; its timeout bounds the whole call.
    """

    channel = Channel.EMAIL

    def __init__(self, config: SmtpSettings, *, timeout: float,
                 connect_timeout: float | None = None, max_connections: int = 4,
                 max_messages_per_connection: int = 100, idle_timeout: float = 30.0,
                 local_hostname: str | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if config.username is not None and config.password is None:
            raise ValueError("smtp.username is set but smtp.password is not")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        if max_connections < 1 or max_messages_per_connection < 1:
            raise ValueError("max_connections and max_messages_per_connection must be >= 1")
        self.provider_id = config.provider_id
        self._config = config
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_per_connection = max_messages_per_connection
        self._idle_timeout = idle_timeout
        self._local_hostname = local_hostname or socket.gethostname() or "localhost"
        self._clock = clock
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False
        self._last_warned: dict[str, float] = {}
        self.stats = PoolStats()

    @classmethod
    async def open(cls, settings: Settings | SmtpSettings, *, timeout: float | timedelta,
                   connect_timeout: float | timedelta | None = None,
                   max_connections: int = 4, max_messages_per_connection: int = 100,
                   idle_timeout: float = 30.0,
                   clock: Callable[[], datetime] = utcnow) -> SmtpEmail:
        """A client bound to the running loop; no connection is made until the first send.

        ``timeout`` bounds each ``send`` as a whole; obtaining a connection (waiting for a
        free one, or connect + EHLO + STARTTLS + AUTH) gets ``connect_timeout`` (default half
        of ``timeout``). Raises ``ValueError`` when ``smtp.username`` is set without
        ``smtp.password``.
        """
        config = settings.smtp if isinstance(settings, Settings) else settings
        return cls(config, timeout=seconds(timeout),
                   connect_timeout=None if connect_timeout is None else seconds(connect_timeout),
                   max_connections=max_connections,
                   max_messages_per_connection=max_messages_per_connection,
                   idle_timeout=idle_timeout, clock=clock)

    async def send(self, message: OutboundMessage, *,
                   timeout: float | timedelta | None = None) -> SendResult:
        """Send one email; ``timeout`` overrides the one given to :meth:`open`."""
        started = self._clock()
        recipient = message.recipient
        if not isinstance(recipient, str) or not valid_address(recipient):
            return self._result(Rule(_P, "invalid_recipient"), message, started,
                                error_code="address")
        try:
            mail = build_message(message, sender=self._config.from_email, now=started)
        except (ValueError, TypeError) as exc:
            return self._result(Rule(_P, "invalid_content"), message, started,
                                error_code=type(exc).__name__)
        total = self._timeout if timeout is None else seconds(timeout)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total
        connect = min(self._connect_timeout or total / 2, total)
        try:
            await asyncio.wait_for(self._slots.acquire(), connect)
        except TimeoutError:
            return self._result(Rule(_T, "connect_timeout"), message, started,
                                error_code="pool_exhausted")
        try:
            return await self._send(message, mail, started, deadline, connect)
        finally:
            self._slots.release()

    async def _send(self, message: OutboundMessage, mail: Mail, started: datetime,
                    deadline: float, connect: float) -> SendResult:
        loop = asyncio.get_running_loop()
        while True:
            progress = _Progress()
            conn: _Connection | None = None
            try:
                conn = await self._checkout(progress, min(connect, deadline - loop.time()))
                reply = await self._transact(conn, message, mail, progress, deadline)
            except _Refused as refused:
                if conn is not None and refused.code != 421:
                    await self._recycle(conn, reset=refused.stage != DATA_END)
                elif conn is not None:
                    self._discard(conn)
                if progress.reused and refused.stage == MAIL and refused.code == 421:
                    self.stats.stale_retries += 1
                    continue
                rule = classify_reply(refused.code, refused.text, refused.stage)
                return self._result(rule, message, started,
                                    error_code=reply_code_text(refused.code, refused.text))
            except Exception as exc:
                if conn is not None:
                    self._discard(conn)
                if (progress.reused and progress.stage == MAIL and not progress.data_sent
                        and isinstance(exc, ConnectionError)):
                    self.stats.stale_retries += 1
                    continue
                if isinstance(exc, aiosmtplib.SMTPResponseException):
                    rule = classify_reply(exc.code, exc.message, progress.stage)
                    return self._result(rule, message, started,
                                        error_code=reply_code_text(exc.code, exc.message))
                rule = classify_failure(exc, data_sent=progress.data_sent)
                if rule.reason == "client_error":
                    log.exception("smtp send of %s attempt %d to %s failed unexpectedly",
                                  message.message_id, message.attempt,
                                  mask(str(message.recipient)))
                return self._result(rule, message, started,
                                    error_code=f"{progress.stage}:{type(exc).__name__}")
            await self._checkin(conn)
            queue_id = queue_id_of(reply.message)
            return SendResult(Outcome.ACCEPTED, self.provider_id, started, self._clock(),
                              provider_message_id=queue_id
                              or message_id_header(message.message_id, message.attempt)[1:-1])

    async def _transact(self, conn: _Connection, message: OutboundMessage, mail: Mail,
                        progress: _Progress, deadline: float) -> aiosmtplib.SMTPResponse:
        """MAIL, RCPT, DATA, content: the ``250`` reply to the end of data; raises
        :class:`_Refused` for a refusing reply and transport exceptions as they come."""
        smtp = conn.smtp
        loop = asyncio.get_running_loop()

        def remaining() -> float:
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("send deadline reached")
            return left

        recipient = str(message.recipient)
        utf8 = not recipient.isascii()
        if utf8 and not smtp.supports_extension("smtputf8"):
            raise _Refused(RCPT, 553, "5.6.7 non-ASCII address and no SMTPUTF8 offered")
        options: list[str] = []
        if smtp.supports_extension("dsn"):
            options.append(f"ENVID={xtext(f'{message.message_id}.{message.attempt}')}")
        if utf8:
            options.append("SMTPUTF8")
        progress.stage = MAIL
        reply = await smtp.execute_command(
            b"MAIL", b"FROM:" + _quoted(self._config.from_email),
            *(o.encode() for o in options), timeout=remaining())
        if reply.code != 250:
            raise _Refused(MAIL, reply.code, reply.message)
        progress.stage = RCPT
        reply = await smtp.execute_command(b"RCPT", b"TO:" + _quoted(recipient),
                                           timeout=remaining())
        if reply.code not in (250, 251):
            raise _Refused(RCPT, reply.code, reply.message)
        progress.stage = DATA
        reply = await smtp.execute_command(b"DATA", timeout=remaining())
        if reply.code != 354:
            raise _Refused(DATA, reply.code, reply.message)
        protocol = smtp.protocol
        if protocol is None:
            raise aiosmtplib.SMTPServerDisconnected("connection lost before the message")
        payload = wire_bytes(mail, utf8=utf8)
        left = remaining()
        progress.stage = DATA_END
        protocol.write(payload)
        progress.data_sent = True
        reply = await protocol.read_response(timeout=left)
        if reply.code != 250:
            raise _Refused(DATA_END, reply.code, reply.message)
        return reply

    async def _checkout(self, progress: _Progress, budget: float) -> _Connection:
        """A pooled connection (most recently used first) or a new one within ``budget``."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.smtp.is_connected and now - conn.last_used < self._idle_timeout:
                self.stats.reused += 1
                progress.reused = True
                return conn
            self._retire(conn)
        if budget <= 0:
            raise aiosmtplib.SMTPConnectTimeoutError("no time left to connect")
        try:
            return await asyncio.wait_for(self._connect(progress), budget)
        except TimeoutError as exc:
            raise aiosmtplib.SMTPConnectTimeoutError(
                f"no session within {budget:.3f} s ({progress.stage})") from exc

    async def _connect(self, progress: _Progress) -> _Connection:
        config = self._config
        smtp = aiosmtplib.SMTP(hostname=config.host, port=config.port,
                               local_hostname=self._local_hostname, start_tls=False,
                               timeout=None)
        try:
            progress.stage = CONNECT
            try:
                await smtp.connect()
            except aiosmtplib.SMTPConnectResponseError as exc:
                raise _Refused(CONNECT, exc.code, exc.message) from exc
            progress.stage = EHLO
            reply = await smtp.ehlo()
            if reply.code != 250:
                raise _Refused(EHLO, reply.code, reply.message)
            if config.starttls:
                progress.stage = STARTTLS
                await smtp.starttls()
            if config.username is not None and config.password is not None:
                progress.stage = AUTH
                try:
                    await smtp.login(config.username, config.password.get_secret_value())
                except aiosmtplib.SMTPAuthenticationError as exc:
                    raise _Refused(AUTH, exc.code, exc.message) from exc
        except BaseException:
            smtp.close()
            raise
        self.stats.opened += 1
        return _Connection(smtp, time.monotonic())

    async def _checkin(self, conn: _Connection) -> None:
        conn.sent += 1
        conn.last_used = time.monotonic()
        if self._closed or conn.sent >= self._max_per_connection:
            self._retire(conn)
        else:
            self._idle.append(conn)

    async def _recycle(self, conn: _Connection, *, reset: bool) -> None:
        """Pool a connection after a refused transaction (RSET first when it was open)."""
        if reset:
            try:
                reply = await conn.smtp.execute_command(b"RSET", timeout=2.0)
            except Exception:
                self._discard(conn)
                return
            if reply.code != 250:
                self._discard(conn)
                return
        conn.last_used = time.monotonic()
        if self._closed or not conn.smtp.is_connected:
            self._retire(conn)
        else:
            self._idle.append(conn)

    def _discard(self, conn: _Connection) -> None:
        self.stats.discarded += 1
        conn.smtp.close()

    def _retire(self, conn: _Connection) -> None:
        """QUIT in the background (bounded), then close."""
        self.stats.retired += 1
        if not conn.smtp.is_connected:
            conn.smtp.close()
            return
        task = asyncio.get_running_loop().create_task(self._quit(conn.smtp))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _quit(smtp: aiosmtplib.SMTP) -> None:
        with contextlib.suppress(Exception):
            await smtp.quit(timeout=2.0)
        smtp.close()

    def _result(self, rule: Rule, message: OutboundMessage, started: datetime, *,
                error_code: str | None = None) -> SendResult:
        if rule.reason in ("auth_failed", "misconfigured"):
            self._warn(rule.reason, error_code)
        elif log.isEnabledFor(logging.DEBUG):
            log.debug("smtp %s attempt %d to %s: %s %s (%s)", message.message_id,
                      message.attempt, mask(str(message.recipient)), rule.outcome,
                      rule.reason, error_code)
        return SendResult(rule.outcome, self.provider_id, started, self._clock(),
                          reason=rule.reason, error_code=error_code,
                          deactivate_recipient=rule.deactivate)

    def _warn(self, reason: str, error_code: str | None) -> None:
        now = time.monotonic()
        if now - self._last_warned.get(reason, -1e9) >= 10.0:
            self._last_warned[reason] = now
            log.warning("smtp relay %s:%d: %s (%s); check the provider settings",
                        self._config.host, self._config.port, reason, error_code)

    async def aclose(self) -> None:
        """QUIT and close every pooled connection; connections in use close when returned."""
        self._closed = True
        while self._idle:
            self._retire(self._idle.pop())
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _quoted(address: str) -> bytes:
    return f"<{address}>".encode()
