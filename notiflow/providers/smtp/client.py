"""SMTP (email) adapter over ``aiosmtplib``: a relay reached with ESMTP, optional STARTTLS and
AUTH (CRAM-MD5, PLAIN or LOGIN, in that order among the mechanisms the server offers).

Each message is one transaction on a pooled connection: ``MAIL FROM:<bounce address>`` (the
attempt's tagged VERP address of :mod:`~notiflow.providers.smtp.bounces` when
correlation keys are given, else ``from_email``; with ``ENVID={message_id}.{attempt}`` when
the server offers DSN), ``RCPT TO:<recipient>``, ``DATA`` and the MIME message of
:mod:`~notiflow.providers.smtp.message` (its ``From`` header the message's
``sender`` when it names one: bounces still come to the bounce address). A ``250``
after the end-of-data terminator is the acceptance; ``provider_message_id`` is the queue id
the reply names (``queued as ...``), else the Message-ID.

Replies and transport failures are classified by the tables of
:mod:`~notiflow.providers.smtp.classify`; ``docs/providers.md`` explains each row.
SMTP has no idempotency key; the tagged bounce address alone correlates later bounces (DSNs)
with the attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import aiosmtplib

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.adapters.providers.common import ProviderBase, Rule, seconds, utcnow
from notiflow.correlation import CorrelationKeyMissing, CorrelationKeys
from notiflow.providers.smtp.bounces import bounce_address
from notiflow.providers.smtp.classify import (
    AUTH,
    CONNECT,
    DATA,
    DATA_END,
    EHLO,
    MAIL,
    RCPT,
    STARTTLS,
    classify_failure,
    classify_reply,
    queue_id_of,
    reply_code_text,
)
from notiflow.providers.smtp.config import SmtpSettings
from notiflow.providers.smtp.message import (
    Mail,
    build_message,
    message_id_header,
    valid_address,
    wire_bytes,
    xtext,
)
from notiflow.redact import mask
from notiflow.schemas.enums import Channel
from notiflow.settings import Settings

log = logging.getLogger(__name__)

_T, _P = Outcome.TRANSIENT, Outcome.PERMANENT


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


class SmtpEmail(ProviderBase):
    """One SMTP relay account as a :class:`~notiflow.adapters.providers.base.ProviderClient`.

    Up to ``max_connections`` connections are opened lazily and reused for consecutive
    messages (one transaction at a time each). A pooled connection is retired after
    ``max_messages_per_connection`` messages or ``idle_timeout`` seconds unused. ``send``
    never raises for replies or transport failures; its timeout bounds the whole call.
    """

    channel = Channel.EMAIL
    name = "smtp"
    log = log

    def __init__(self, config: SmtpSettings, *, timeout: float,
                 connect_timeout: float | None = None, max_connections: int = 4,
                 max_messages_per_connection: int = 100, idle_timeout: float = 30.0,
                 local_hostname: str | None = None,
                 clock: Callable[[], datetime] = utcnow,
                 bounce_keys: CorrelationKeys | None = None) -> None:
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
        self._bounce_keys = bounce_keys
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
        keys = None
        if isinstance(settings, Settings):
            try:
                keys = CorrelationKeys.from_settings(settings)
            except CorrelationKeyMissing:
                log.warning("no correlation key: SMTP bounces cannot be correlated")
        return cls(config, timeout=seconds(timeout), bounce_keys=keys,
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
            mail = build_message(message, sender=message.sender or self._config.from_email,
                                 now=started)
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
            return self._accepted(started, queue_id or message_id_header(
                message.message_id, message.attempt)[1:-1])

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
            b"MAIL", b"FROM:" + _quoted(self.envelope_sender(message)),
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

    def envelope_sender(self, message: OutboundMessage) -> str:
        """``MAIL FROM`` of an attempt: its tagged bounce address, or ``from_email`` without
        correlation keys."""
        if self._bounce_keys is None:
            return self._config.from_email
        return bounce_address(self._bounce_keys, self._config.from_email, message.message_id,
                              message.attempt)

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

    def _account_label(self) -> str:
        return f"relay {self._config.host}:{self._config.port}"

    async def aclose(self) -> None:
        """QUIT and close every pooled connection; connections in use close when returned."""
        self._closed = True
        while self._idle:
            self._retire(self._idle.pop())
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _quoted(address: str) -> bytes:
    return f"<{address}>".encode()
