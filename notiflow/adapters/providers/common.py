"""Helpers shared by the provider adapters: the classification :class:`Rule`, the transport
table of the ``aiohttp``-based adapters, ``Retry-After`` parsing, SMS text facts (GSM-7
alphabet, segment count), :class:`ProviderBase` (results and throttled misconfiguration
warnings) and :class:`HttpProvider` (the pooled session, per-call timeouts and the classified
POST of the ``aiohttp`` adapters).

The adapters import these from here; ``notiflow.adapters.providers.twilio`` re-exports
``Rule``, ``classify_exception`` and ``parse_retry_after`` for callers that import them from
there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Final, Generic, Protocol, Self, TypeVar

import aiohttp
import orjson
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.redact import mask
from notiflow.schemas.messages import PushRecipient


@dataclass(frozen=True, slots=True)
class Rule:
    """How one provider answer is classified."""

    outcome: Outcome
    reason: str
    deactivate: bool = False


_T, _P, _A = Outcome.TRANSIENT, Outcome.PERMANENT, Outcome.AMBIGUOUS

HTTP_DEFAULTS: Final[Mapping[int, Rule]] = {
    400: Rule(_P, "rejected"),
    401: Rule(_T, "auth_failed"),
    403: Rule(_T, "misconfigured"),
    404: Rule(_T, "misconfigured"),
    405: Rule(_T, "misconfigured"),
    408: Rule(_T, "timeout"),
    413: Rule(_P, "invalid_content"),
    429: Rule(_T, "rate_limited"),
    500: Rule(_A, "server_error"),
    502: Rule(_T, "server_error"),
    503: Rule(_T, "server_error"),
    504: Rule(_A, "gateway_timeout"),
}
"""HTTP status → rule shared by the JSON-over-HTTP providers (Twilio, Vonage, FCM) for answers
without a provider error code they recognise. 500 and 504 may come after the request was
acted on: AMBIGUOUS."""

TRANSPORT_ERRORS: Final[tuple[tuple[type[BaseException], Rule], ...]] = (
    (aiohttp.ConnectionTimeoutError, Rule(_T, "connect_timeout")),
    (aiohttp.ClientConnectorError, Rule(_T, "connect_error")),
    (aiohttp.InvalidURL, Rule(_T, "misconfigured")),
    (TimeoutError, Rule(_A, "timeout")),
    (aiohttp.ServerDisconnectedError, Rule(_A, "connection_lost")),
    (aiohttp.ClientPayloadError, Rule(_A, "connection_lost")),
    (aiohttp.ClientOSError, Rule(_A, "connection_lost")),
    (aiohttp.ClientError, Rule(_A, "transport_error")),
    (Exception, Rule(_A, "client_error")),
)
"""Exception type → rule for the ``aiohttp`` adapters, first ``isinstance`` match wins.
Connection set-up failures happen before a byte of the request is sent (TRANSIENT); anything
later may have been processed."""

def classify_exception(exc: BaseException) -> Rule:
    """The rule for a transport failure (see :data:`TRANSPORT_ERRORS`)."""
    for kind, rule in TRANSPORT_ERRORS:
        if isinstance(exc, kind):
            return rule
    return Rule(_A, "client_error")


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); None if
    absent or unparseable. Never negative."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def seconds(value: float | timedelta) -> float:
    """``value`` in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def utcnow() -> datetime:
    return datetime.now(UTC)


GSM7_BASIC: Final = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "ÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà")
"""The GSM 03.38 default alphabet (one septet each)."""
GSM7_EXTENDED: Final = frozenset("^{}\\[~]|€\f")
"""Characters of the GSM 03.38 extension table (two septets each: escape + character)."""


def is_gsm7(text: str) -> bool:
    """True when ``text`` can be sent in the GSM-7 encoding."""
    return all(c in GSM7_BASIC or c in GSM7_EXTENDED for c in text)


def sms_segments(body: str, *, ucs2: bool = False) -> int:
    """SMS segments a carrier bills for ``body`` (GSM-7: 160/153 septets, else UCS-2:
    70/67 UTF-16 code units); ``ucs2`` forces UCS-2 (a ``unicode`` message)."""
    if not ucs2 and is_gsm7(body):
        units = len(body) + sum(c in GSM7_EXTENDED for c in body)
        single, multi = 160, 153
    else:
        units = len(body.encode("utf-16-le")) // 2
        single, multi = 70, 67
    return 1 if units <= single else -(-units // multi)


# the adapters ------------------------------------------------------------------------------

INVALID_RECIPIENT: Final = Rule(_P, "invalid_recipient")


def masked(recipient: str | PushRecipient) -> str:
    """``recipient`` as logs show it (:func:`~notiflow.redact.mask`; a push recipient as
    ``platform:token``)."""
    if isinstance(recipient, PushRecipient):
        return mask(f"{recipient.platform.value}:{recipient.device_token}")
    return mask(recipient)


def parse_json(raw: bytes) -> Any:
    """The JSON value of a response body; None when empty or not JSON."""
    try:
        return orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return None


class ProviderBase:
    """The :class:`SendResult` of a rule, logged under the adapter's logger: a throttled
    warning for reasons that mean our own configuration is wrong, else a debug line."""

    name: ClassVar[str]
    """Log prefix (``twilio``)."""
    log: ClassVar[logging.Logger]
    warn_reasons: ClassVar[frozenset[str]] = frozenset({"auth_failed", "misconfigured"})
    """Reasons that warn (at most every 10 s per reason) instead of logging at debug."""

    provider_id: str
    _clock: Callable[[], datetime]
    _last_warned: dict[str, float]

    def _account_label(self) -> str:
        """What the misconfiguration warning names (``account AC123``)."""
        return f"account {self.provider_id}"

    def _accepted(self, started: datetime, provider_message_id: str) -> SendResult:
        """The provider took the message as ``provider_message_id``."""
        return SendResult(Outcome.ACCEPTED, self.provider_id, started, self._clock(),
                          provider_message_id=provider_message_id)

    def _result(self, rule: Rule, message: OutboundMessage, started: datetime, *,
                error_code: str | None = None, retry_after_s: float | None = None) -> SendResult:
        """The result ``rule`` gives ``message``, logged."""
        if rule.reason in self.warn_reasons:
            self._warn(rule.reason, error_code)
        elif self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("%s %s attempt %d to %s: %s %s (%s)", self.name, message.message_id,
                           message.attempt, masked(message.recipient), rule.outcome,
                           rule.reason, error_code)
        return SendResult(rule.outcome, self.provider_id, started, self._clock(),
                          reason=rule.reason, error_code=error_code,
                          retry_after_s=retry_after_s, deactivate_recipient=rule.deactivate)

    def _warn(self, reason: str, error_code: str | None) -> None:
        now = time.monotonic()
        if now - self._last_warned.get(reason, -1e9) >= 10.0:
            self._last_warned[reason] = now
            self.log.warning("%s %s: %s (%s); check the provider settings", self.name,
                             self._account_label(), reason, error_code)


def client_timeout(total: float, connect: float | None) -> aiohttp.ClientTimeout:
    """``total`` for the whole request; ``connect`` (default half of it) for connection set-up,
    a wait for a free pooled connection included."""
    return aiohttp.ClientTimeout(total=total, connect=connect if connect else total / 2)


def http_session(headers: Mapping[str, str], max_connections: int) -> aiohttp.ClientSession:
    """A pooled session sending ``headers`` with every request; never raises for a status."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=max_connections,
                                     ttl_dns_cache=300, keepalive_timeout=15)
    return aiohttp.ClientSession(connector=connector, headers=dict(headers),
                                 raise_for_status=False)


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """A provider's HTTP answer: status, raw body and the response headers the adapter kept."""

    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        """The body as JSON (None when empty or not JSON)."""
        return parse_json(self.body)


class ProviderConfig(Protocol):
    """A provider account's settings section."""

    @property
    def provider_id(self) -> str: ...


C = TypeVar("C", bound=ProviderConfig)


class HttpProvider(ProviderBase, Generic[C]):
    """An ``aiohttp`` adapter of one account (settings section ``C``).

    Subclasses give :meth:`_encode` (the request body) and :meth:`_classify` (the
    :class:`SendResult` of an answer) and set ``_url``; :meth:`send` posts one string-addressed
    message, bounded by the caller's timeout, and classifies transport failures through
    :data:`TRANSPORT_ERRORS`. Fully custom senders (FCM) use :meth:`_post` directly.
    """

    answer_headers: ClassVar[tuple[str, ...]] = ("Retry-After",)
    """Response headers kept in :attr:`HttpAnswer.headers`."""

    _url: URL

    def __init__(self, config: C, session: aiohttp.ClientSession, *, timeout: float,
                 connect_timeout: float | None = None,
                 clock: Callable[[], datetime] = utcnow) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.provider_id = config.provider_id
        self._config = config
        self._session = session
        self._clock = clock
        self._timeout_s = timeout
        self._connect_timeout_s = connect_timeout
        self._default_limits = client_timeout(timeout, connect_timeout)
        self._last_warned = {}

    @classmethod
    async def _open(cls, config: C, headers: Mapping[str, str], *, timeout: float | timedelta,
                    connect_timeout: float | timedelta | None, max_connections: int,
                    clock: Callable[[], datetime]) -> Self:
        """An instance on a new pooled session, which is closed again if construction fails."""
        session = http_session(headers, max_connections)
        try:
            return cls(config, session, timeout=seconds(timeout),
                       connect_timeout=None if connect_timeout is None
                       else seconds(connect_timeout), clock=clock)
        except BaseException:
            await session.close()
            raise

    def _limits(self, timeout: float | timedelta | None) -> aiohttp.ClientTimeout:
        """The limits of one call: the client's, or ``timeout`` with half of it to connect."""
        if timeout is None:
            return self._default_limits
        return client_timeout(seconds(timeout), None)

    def _encode(self, message: OutboundMessage) -> bytes:
        """The request body for ``message``."""
        raise NotImplementedError

    def _classify(self, answer: HttpAnswer, message: OutboundMessage,
                  started: datetime) -> SendResult:
        """The result of the provider's answer to ``message``."""
        raise NotImplementedError

    async def send(self, message: OutboundMessage, *,
                   timeout: float | timedelta | None = None) -> SendResult:
        """Send one message; ``timeout`` overrides the one given to ``open``."""
        started = self._clock()
        if not isinstance(message.recipient, str):
            return self._result(INVALID_RECIPIENT, message, started)
        limits = self._limits(timeout)
        answer = await self._post(self._url, self._encode(message), limits, message, started)
        if isinstance(answer, SendResult):
            return answer
        return self._classify(answer, message, started)

    async def _post(self, url: URL, data: bytes, limits: aiohttp.ClientTimeout,
                    message: OutboundMessage, started: datetime, *,
                    headers: Mapping[str, str] | None = None) -> HttpAnswer | SendResult:
        """POST ``data``: the answer, or the classified result of a transport failure."""
        try:
            async with self._session.post(url, data=data, timeout=limits, allow_redirects=False,
                                          headers=headers) as resp:
                body = await resp.read()
                return HttpAnswer(resp.status, body, {k: resp.headers[k]
                                                      for k in self.answer_headers
                                                      if k in resp.headers})
        except Exception as exc:
            rule = classify_exception(exc)
            if rule.reason == "client_error":
                self.log.exception("%s send of %s attempt %d to %s failed unexpectedly",
                                   self.name, message.message_id, message.attempt,
                                   masked(message.recipient))
            return self._result(rule, message, started, error_code=type(exc).__name__)

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._session.close()
