"""SMTP relay emulator (``notiflow fakes``; dev, tests, benchmarks), on ``aiosmtpd``.

Listens on ``fakes_host:fakes_smtp_port`` in the same event loop as the HTTP emulators (started
and stopped with the app). It speaks ESMTP with ``SIZE``, ``8BITMIME``, ``SMTPUTF8``, ``DSN``
(``ENVID`` on ``MAIL FROM`` is accepted and kept) and ``AUTH LOGIN PLAIN`` without TLS, and
requires AUTH with ``smtp.username`` / ``smtp.password`` (``530 5.7.0`` before it, ``535
5.7.8`` for wrong credentials). Knobs over ``/_admin/smtp/config`` — latency, outage (``421
4.3.2`` at connect and on ``MAIL``), per-reply error rates, 4.7.x throttling, accepted-then-hang
after the end of data — and records per transaction at ``/_admin/smtp/messages`` with the
``message_id`` / ``attempt`` of ``X-Notiflow-Message-Id`` / ``X-Notiflow-Attempt`` (or of the
``ENVID`` while no content was received). Recipients and bodies are recorded: test
infrastructure only.

Magic recipient domains (emulator only): ``bounce.example.com`` → ``550 5.1.1`` at RCPT,
``full.example.com`` → ``552 5.2.2``, ``disabled.example.com`` → ``550 5.2.1``,
``invalid.example.com`` → ``553 5.1.3``, ``greylist.example.com`` → ``451 4.7.1`` the first
time an address is tried, ``policy.example.com`` → ``554 5.7.1`` after the data;
``dsn-bounce.example.com`` is accepted and then bounces: an RFC 3464 delivery status
notification (``failed``, ``5.1.1``) is posted to the knob ``dsn_url`` (default
``smtp.dsn_webhook_url``) with ``Authorization: Bearer <smtp.dsn_webhook_secret>``, as a
relay's bounce pipe would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import warnings
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import format_datetime, make_msgid
from typing import Any, Final, cast

import aiohttp
from aiohttp import web
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session, syntax
from pydantic import Field

from notiflow.fakes.common import ACCEPTED, BaseKnobs, Emulator, MessageRecord, WebhookDispatcher
from notiflow.providers.smtp.message import ATTEMPT_HEADER, MESSAGE_ID_HEADER
from notiflow.settings import Settings

log = logging.getLogger(__name__)

HOSTNAME: Final = "smtp.emulator.notiflow.test"
OUTAGE_REPLY: Final = "421 4.3.2 Service not available, closing transmission channel"

MAGIC_RCPT: Final[Mapping[str, str]] = {
    "bounce.example.com": "550 5.1.1 <{rcpt}>: Recipient address rejected: User unknown in "
                          "virtual mailbox table",
    "full.example.com": "552 5.2.2 <{rcpt}>: Recipient address rejected: Mailbox full",
    "disabled.example.com": "550 5.2.1 <{rcpt}>: Recipient address rejected: Mailbox "
                            "disabled, not accepting messages",
    "invalid.example.com": "553 5.1.3 <{rcpt}>: Recipient address rejected: Bad destination "
                           "mailbox address syntax",
}
"""Recipient domain → the reply to its ``RCPT TO``."""
GREYLIST_DOMAIN: Final = "greylist.example.com"
GREYLIST_REPLY: Final = ("451 4.7.1 <{rcpt}>: Recipient address rejected: Greylisted, please "
                         "try again later")
POLICY_DOMAIN: Final = "policy.example.com"
POLICY_REPLY: Final = "554 5.7.1 Message rejected: content policy violation"
DSN_BOUNCE_DOMAIN: Final = "dsn-bounce.example.com"
"""Recipients here are accepted, then bounce with a DSN (``failed``, ``5.1.1``)."""
DSN_BOUNCE_DIAGNOSTIC: Final = ("smtp; 550 5.1.1 <{rcpt}>: Recipient address rejected: User "
                                "unknown in virtual mailbox table")

REPLIES: Final[Mapping[str, str]] = {
    "421": "421 4.3.0 Service shutting down, closing transmission channel",
    "429": "451 4.7.1 Too many messages, slow down and try again later",
    "451": "451 4.3.0 Error: queue file write error",
    "452": "452 4.3.1 Insufficient system storage",
    "550": "550 5.1.1 <{rcpt}>: Recipient address rejected: User unknown in local recipient "
           "table",
    "552": "552 5.2.2 <{rcpt}>: Recipient address rejected: Mailbox full",
    "554": "554 5.7.1 Message rejected: policy violation",
}
"""Error-mix knob → the reply it provokes (``429`` is the 4.7.x throttling knob)."""

_ENHANCED = re.compile(r"^\d{3} ([245]\.\d{1,3}\.\d{1,3})")


class SmtpKnobs(BaseKnobs):
    """Runtime behaviour of the SMTP emulator. ``outage`` answers ``421 4.3.2`` at connect (and
    on ``MAIL`` of open connections, closing them); ``timeout_rate`` accepts the message and
    delays the final ``250`` by ``hang_s``; ``latency_ms`` delays the reply to the end of
    data."""

    error_rate_429: float = Field(0.0, ge=0, le=1)
    """Share of ``MAIL FROM`` answered ``451 4.7.1`` (throttling: SMTP's 429)."""
    error_rate_421: float = Field(0.0, ge=0, le=1)
    """Share of ``MAIL FROM`` answered ``421 4.3.0`` (and the connection closed)."""
    error_rate_452: float = Field(0.0, ge=0, le=1)
    """Share of ``RCPT TO`` answered ``452 4.3.1``."""
    error_rate_550: float = Field(0.0, ge=0, le=1)
    """Share of ``RCPT TO`` answered ``550 5.1.1`` (a hard bounce)."""
    error_rate_552: float = Field(0.0, ge=0, le=1)
    """Share of ``RCPT TO`` answered ``552 5.2.2`` (mailbox full)."""
    error_rate_451: float = Field(0.0, ge=0, le=1)
    """Share of messages answered ``451 4.3.0`` after the data."""
    error_rate_554: float = Field(0.0, ge=0, le=1)
    """Share of messages answered ``554 5.7.1`` after the data."""
    greylisting: bool = True
    """Whether ``greylist.example.com`` recipients are greylisted once."""
    dsn_url: str | None = None
    """Where DSNs go; None = the configured ``smtp.dsn_webhook_url`` (no DSN without one)."""
    dsn_delay_ms: float = Field(50.0, ge=0)
    """Delay between accepting a ``dsn-bounce.example.com`` message and posting its DSN."""


@dataclass(slots=True)
class SmtpRecord(MessageRecord):
    """One SMTP transaction (or refused connection); ``status`` is the final reply code,
    ``sid`` the queue id, ``to`` the recipient, ``from`` the envelope sender."""

    stage: str = ""
    enhanced: str | None = None
    reply: str | None = None
    subject: str | None = None
    smtp_message_id: str | None = None
    """The ``Message-ID`` header."""
    header_from: str | None = None
    """The ``From`` header (who the reader sees; ``from`` is where bounces go)."""


@dataclass(slots=True)
class _Transaction:
    """What one connection knows about its current transaction."""

    envid: str | None = None
    mail_from: str | None = None
    rcpt: str | None = None


def _xtext_decode(value: str) -> str:
    return re.sub(r"\+([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), value)


def _correlation(envid: str | None) -> tuple[str | None, int | None]:
    """(message_id, attempt) of an ``ENVID`` of ``{message_id}.{attempt}``."""
    if not envid:
        return None, None
    message_id, sep, attempt = _xtext_decode(envid).rpartition(".")
    if not sep or not attempt.isdigit():
        return None, None
    return message_id, int(attempt)


def build_dsn(*, sender: str, rcpt: str, original_headers: bytes, queue_id: str,
              envid: str | None = None, status: str = "5.1.1", action: str = "failed",
              diagnostic: str | None = None, reporting_mta: str = HOSTNAME) -> bytes:
    """A bounce as a Postfix-style relay writes it (RFC 3464 / RFC 6522): ``multipart/report;
    report-type=delivery-status`` with a human-readable part, the ``message/delivery-status``
    fields (``X-Postfix-Queue-ID``, ``Original-Envelope-Id``, one recipient) and the original
    headers as ``text/rfc822-headers``; CRLF line ends."""
    now = format_datetime(datetime.now(UTC))
    boundary = f"{queue_id}.{os.urandom(6).hex()}/{reporting_mta}"
    headers = original_headers.replace(b"\r\n", b"\n").rstrip(b"\n").decode(
        "utf-8", "replace")
    per_message = [f"Reporting-MTA: dns; {reporting_mta}", f"X-Postfix-Queue-ID: {queue_id}"]
    if envid:
        per_message.append(f"Original-Envelope-Id: {envid}")
    per_message.append(f"Arrival-Date: {now}")
    per_recipient = [f"Final-Recipient: rfc822; {rcpt}", f"Original-Recipient: rfc822; {rcpt}",
                     f"Action: {action}", f"Status: {status}",
                     f"Remote-MTA: dns; mx.{rcpt.rpartition('@')[2]}"]
    if diagnostic:
        per_recipient.append(f"Diagnostic-Code: {diagnostic}")
    per_recipient.append(f"Last-Attempt-Date: {now}")
    lines = [
        f"From: MAILER-DAEMON@{reporting_mta} (Mail Delivery System)",
        f"To: {sender}",
        "Subject: Undelivered Mail Returned to Sender",
        f"Date: {now}",
        f"Message-ID: {make_msgid(domain=reporting_mta)}",
        "Auto-Submitted: auto-replied",
        "MIME-Version: 1.0",
        f'Content-Type: multipart/report; report-type=delivery-status; boundary="{boundary}"',
        "",
        "This is a MIME-encapsulated message.",
        "",
        f"--{boundary}",
        "Content-Description: Notification",
        "Content-Type: text/plain; charset=us-ascii",
        "",
        f"This is the mail system at host {reporting_mta}.",
        "",
        "I'm sorry to have to inform you that your message could not",
        "be delivered to one or more recipients.",
        "",
        f"--{boundary}",
        "Content-Description: Delivery report",
        "Content-Type: message/delivery-status",
        "",
        *per_message,
        "",
        *per_recipient,
        "",
        f"--{boundary}",
        "Content-Description: Undelivered Message Headers",
        "Content-Type: text/rfc822-headers",
        "",
        *headers.split("\n"),
        "",
        f"--{boundary}--",
        "",
    ]
    return "\r\n".join(lines).encode()


class _Server(SMTP):
    """aiosmtpd's SMTP session, plus ``ENVID`` on ``MAIL FROM`` (RFC 3461): it is taken off
    the command (aiosmtpd would refuse an unknown parameter) and kept for the transaction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transaction = _Transaction()

    @syntax("MAIL FROM: <address>", extended=" [SP <mail-parameters>]")
    async def smtp_MAIL(self, arg: str | None) -> None:
        self.transaction = _Transaction()
        if arg:
            kept = []
            for token in arg.split():
                if token.upper().startswith("ENVID="):
                    self.transaction.envid = token[len("ENVID="):]
                else:
                    kept.append(token)
            arg = " ".join(kept)
        await super().smtp_MAIL(arg)


class _Refuse(asyncio.Protocol):
    """A connection turned away with ``421`` before the greeting (the outage knob)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        writer = cast(asyncio.WriteTransport, transport)
        writer.write(OUTAGE_REPLY.encode() + b"\r\n")
        writer.close()


class _KnownWarnings(logging.Filter):
    """Drops aiosmtpd's per-connection warnings about choices made on purpose here (AUTH
    without TLS on loopback; its own deprecated ``login_data``)."""

    KNOWN: Final = ("auth_require_tls", "login_data is deprecated")

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(known in text for known in self.KNOWN)


class SmtpEmulator(Emulator[SmtpKnobs]):
    """State, aiosmtpd hooks and admin endpoints of the SMTP emulator."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("smtp", SmtpKnobs)
        config = settings.smtp
        self.host = settings.fakes_host
        self.port = settings.fakes_smtp_port
        self._username = config.username.encode() if config.username is not None else None
        self._password = (config.password.get_secret_value().encode()
                          if config.password is not None else None)
        self._server: asyncio.Server | None = None
        self._sessions: weakref.WeakSet[_Server] = weakref.WeakSet()
        self._greylisted: set[str] = set()
        self.counts: Counter[str] = Counter()
        self._parser = BytesParser(policy=policy.default)
        self._dsn_secret = (config.dsn_webhook_secret.get_secret_value()
                            if config.dsn_webhook_secret is not None else None)
        self._dsn_url = config.dsn_webhook_url
        self.dsns: WebhookDispatcher[bytes] = WebhookDispatcher(
            "smtp-dsn", self._post_dsn, user_agent="notiflow-smtp-emulator/1")
        if self._username is None or self._password is None:
            log.warning("smtp emulator: no username/password configured "
                        "(NOTIFLOW_SMTP__USERNAME, NOTIFLOW_SMTP__PASSWORD); every AUTH fails")

    def routes(self) -> list[web.RouteDef]:
        return self.admin_routes()

    async def lifecycle(self, _app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx`` hook: the SMTP listener and the DSN dispatcher run while the app
        runs."""
        await self.dsns.start()
        await self.start()
        yield
        await self.stop()
        await self.dsns.stop()

    async def start(self) -> None:
        """Listen on ``host:port`` in the running loop."""
        mail_log = logging.getLogger("mail.log")
        mail_log.setLevel(max(mail_log.level, logging.WARNING))
        mail_log.addFilter(_KnownWarnings())
        warnings.filterwarnings("ignore", message="Requiring AUTH while not requiring TLS",
                                category=UserWarning)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, self.host, self.port,
                                                reuse_address=True)
        log.info("smtp emulator listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close every open session (hanging replies included)."""
        if self._server is None:
            return
        self._server.close()
        for session in list(self._sessions):
            if session.transport is not None:
                session.transport.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None

    def reset(self) -> None:
        super().reset()
        self._greylisted.clear()
        self.counts.clear()
        self.dsns.clear()

    def extra_stats(self) -> dict[str, Any]:
        return {"connections": {"opened": self.counts["connections"],
                                "refused": self.counts["refused"],
                                "open": len(self._sessions)},
                "auth": {"succeeded": self.counts["auth_ok"],
                         "failed": self.counts["auth_failed"]},
                "dsns": self.dsns.stats()}

    async def _post_dsn(self, session: aiohttp.ClientSession, url: str, dsn: bytes) -> int:
        headers = {"Content-Type": "message/rfc822"}
        if self._dsn_secret is not None:
            headers["Authorization"] = f"Bearer {self._dsn_secret}"
        async with session.post(url, data=dsn, headers=headers) as resp:
            await resp.read()
            return resp.status

    def _schedule_dsn(self, txn: _Transaction, raw: bytes, queue_id: str) -> None:
        url = self.knobs.dsn_url or self._dsn_url
        if not url or txn.rcpt is None:
            return
        head = raw.split(b"\n\n", 1)[0]
        dsn = build_dsn(sender=txn.mail_from or "", rcpt=txn.rcpt, original_headers=head,
                        queue_id=queue_id,
                        envid=_xtext_decode(txn.envid) if txn.envid else None,
                        diagnostic=DSN_BOUNCE_DIAGNOSTIC.format(rcpt=txn.rcpt))
        self.dsns.schedule(time.monotonic() + self.knobs.dsn_delay_ms / 1000, url, dsn)

    # sessions ----------------------------------------------------------------------------

    def _protocol(self) -> asyncio.Protocol:
        if self.knobs.outage:
            self.counts["refused"] += 1
            self._record("outage", OUTAGE_REPLY, stage="connect")
            return _Refuse()
        self.counts["connections"] += 1
        server = _Server(self, hostname=HOSTNAME, ident="notiflow SMTP emulator",
                         auth_required=True, auth_require_tls=False,
                         authenticator=self._authenticate, enable_SMTPUTF8=True,
                         loop=asyncio.get_running_loop())
        self._sessions.add(server)
        return server

    def _authenticate(self, server: SMTP, session: Session, envelope: Envelope,
                      mechanism: str, auth_data: Any) -> AuthResult:
        ok = (isinstance(auth_data, LoginPassword) and self._username is not None
              and self._password is not None and auth_data.login == self._username
              and auth_data.password == self._password)
        if ok:
            self.counts["auth_ok"] += 1
            return AuthResult(success=True)
        self.counts["auth_failed"] += 1
        self._record("unauthorized", "535 5.7.8 Authentication credentials invalid",
                     stage="auth")
        return AuthResult(success=False, handled=False)

    def _record(self, outcome: str, reply: str, *, stage: str,
                txn: _Transaction | None = None, mail: EmailMessage | None = None,
                body: str | None = None, sid: str | None = None, hang: bool = False) -> None:
        message_id, attempt = _correlation(txn.envid if txn else None)
        subject = smtp_message_id = header_from = None
        if mail is not None:
            message_id = str(mail.get(MESSAGE_ID_HEADER, "")) or message_id
            attempt_text = str(mail.get(ATTEMPT_HEADER, ""))
            attempt = int(attempt_text) if attempt_text.isdigit() else attempt
            subject = str(mail["Subject"]) if mail["Subject"] is not None else None
            smtp_message_id = str(mail["Message-ID"]) if mail["Message-ID"] else None
            header_from = str(mail["From"]) if mail["From"] else None
        enhanced = _ENHANCED.match(reply)
        self.messages.add(SmtpRecord(
            time.time(), outcome, int(reply[:3]), None, sid, message_id, attempt,
            txn.rcpt if txn else None, txn.mail_from if txn else None, body, hang,
            stage=stage, enhanced=enhanced.group(1) if enhanced else None, reply=reply,
            subject=subject, smtp_message_id=smtp_message_id, header_from=header_from))

    @staticmethod
    def _close_soon(server: SMTP) -> None:
        transport = server.transport
        if transport is not None:
            asyncio.get_running_loop().call_soon(transport.close)

    # aiosmtpd hooks ----------------------------------------------------------------------

    async def handle_EHLO(self, server: SMTP, session: Session, envelope: Envelope,
                          hostname: str, responses: list[str]) -> list[str]:
        session.host_name = hostname
        return [*responses[:-1], "250-DSN", responses[-1]]

    async def handle_MAIL(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, mail_options: list[str]) -> str:
        assert isinstance(server, _Server)
        txn = server.transaction
        txn.mail_from = address
        knobs = self.knobs
        if knobs.outage:
            self._record("outage", OUTAGE_REPLY, stage="mail", txn=txn)
            self._close_soon(server)
            return OUTAGE_REPLY
        if self.draw(knobs.error_rate_421):
            self._record("server_error", REPLIES["421"], stage="mail", txn=txn)
            self._close_soon(server)
            return REPLIES["421"]
        if self.draw(knobs.error_rate_429):
            self._record("rate_limited", REPLIES["429"], stage="mail", txn=txn)
            return REPLIES["429"]
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 2.1.0 Ok"

    async def handle_RCPT(self, server: SMTP, session: Session, envelope: Envelope,
                          address: str, rcpt_options: list[str]) -> str:
        assert isinstance(server, _Server)
        txn = server.transaction
        txn.rcpt = address
        knobs = self.knobs
        domain = address.rpartition("@")[2].lower()
        reply = MAGIC_RCPT.get(domain)
        if reply is None and domain == GREYLIST_DOMAIN and knobs.greylisting:
            key = address.lower()
            if key not in self._greylisted:
                self._greylisted.add(key)
                reply = GREYLIST_REPLY
        if reply is None:
            for knob in ("452", "550", "552"):
                if self.draw(getattr(knobs, f"error_rate_{knob}")):
                    reply = REPLIES[knob]
                    break
        if reply is not None:
            reply = reply.format(rcpt=address)
            outcome = "rate_limited" if " 4.7." in reply else (
                "server_error" if reply.startswith("4") else "invalid")
            self._record(outcome, reply, stage="rcpt", txn=txn)
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        assert isinstance(server, _Server)
        txn = server.transaction
        knobs = self.knobs
        raw = (envelope.original_content or b"").replace(b"\r\n", b"\n")
        mail = self._parser.parsebytes(raw)
        assert isinstance(mail, EmailMessage)
        body = _text_body(mail)
        await self.added_latency(knobs)
        reply: str | None = None
        outcome = "rejected"
        if self.draw(knobs.error_rate_451):
            reply, outcome = REPLIES["451"], "server_error"
        elif (txn.rcpt or "").rpartition("@")[2].lower() == POLICY_DOMAIN:
            reply = POLICY_REPLY
        elif self.draw(knobs.error_rate_554):
            reply = REPLIES["554"]
        if reply is not None:
            self._record(outcome, reply, stage="data_end", txn=txn, mail=mail, body=body)
            return reply
        queue_id = os.urandom(6).hex().upper()
        hang = self.draw(knobs.timeout_rate)
        reply = f"250 2.0.0 Ok: queued as {queue_id}"
        self._record(ACCEPTED, reply, stage="data_end", txn=txn, mail=mail, body=body,
                     sid=queue_id, hang=hang)
        if (txn.rcpt or "").rpartition("@")[2].lower() == DSN_BOUNCE_DOMAIN:
            self._schedule_dsn(txn, raw, queue_id)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return reply


def _text_body(mail: EmailMessage) -> str | None:
    """The ``text/plain`` body without the final line break MIME adds."""
    part = mail.get_body(("plain",))
    if part is None:
        return None
    try:
        content = part.get_content()
    except (LookupError, ValueError):
        return None
    return content[:-1] if isinstance(content, str) and content.endswith("\n") else content
