"""Helpers shared by the provider adapters: the classification :class:`Rule`; the HTTP status
tables and the classify-by-status logic of the HTTP providers (:data:`HTTP_DEFAULTS`,
:data:`STATUS_CLASSES`, :func:`status_rule`, :func:`coded_rule`); the transport table of the
``aiohttp``-based adapters and ``Retry-After`` parsing; :class:`ProviderBase` (results and
throttled misconfiguration warnings) and :class:`HttpProvider` (the pooled session, per-call
timeouts and the classified POST of the ``aiohttp`` adapters).

Each provider's ``classify`` module holds only its own rows and names the shared tables it
uses; this module holds the rows every HTTP provider shares.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Final, Generic, Protocol, Self, TypeVar

import aiohttp
import orjson
from yarl import URL

from notiflow.adapters.providers.base import OutboundMessage, Outcome, SendResult
from notiflow.redact import mask
from notiflow.schemas.enums import PushPlatform
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings


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
"""HTTP status → rule shared by the JSON-over-HTTP providers (Twilio, Vonage, FCM; SendGrid and
APNs derive theirs from it) for answers without a provider error code they recognise. 500 and
504 may come after the request was acted on: AMBIGUOUS."""

STATUS_CLASSES: Final[Mapping[int, Rule]] = {
    1: Rule(_A, "unexpected_status"),
    2: Rule(_A, "malformed_response"),
    3: Rule(_T, "misconfigured"),
    4: Rule(_P, "rejected"),
    5: Rule(_T, "server_error"),
}
"""``status // 100`` → rule; the last resort for a non-success answer. A 2xx the adapter cannot
read as an acceptance (a proxy, a wrong base URL, a body without the provider's id) is
AMBIGUOUS ``malformed_response``."""

UNEXPECTED_STATUS: Final = Rule(_A, "unexpected_status")
"""A status outside every table and class (below 100, 600 and above)."""

K = TypeVar("K")


def status_rule(status: int, statuses: Mapping[int, Rule] = HTTP_DEFAULTS,
                classes: Mapping[int, Rule] = STATUS_CLASSES) -> Rule:
    """The rule of a non-success HTTP answer by its status: the ``statuses`` row, else the
    ``classes`` row of ``status // 100``, else :data:`UNEXPECTED_STATUS`."""
    rule = statuses.get(status)
    if rule is not None:
        return rule
    return classes.get(status // 100, UNEXPECTED_STATUS)


def coded_rule(code: K | None, codes: Mapping[K, Rule], status: int,
               statuses: Mapping[int, Rule] = HTTP_DEFAULTS,
               classes: Mapping[int, Rule] = STATUS_CLASSES) -> Rule:
    """The ``codes`` row of the provider's own error ``code`` when it has one, else
    :func:`status_rule` (absent and unknown codes fall through to the status)."""
    if code is not None and (rule := codes.get(code)) is not None:
        return rule
    return status_rule(status, statuses, classes)


def retry_wait(rule: Rule, retry_after: str | None) -> float | None:
    """The ``Retry-After`` wait of a TRANSIENT answer; None for any other outcome."""
    return parse_retry_after(retry_after) if rule.outcome is Outcome.TRANSIENT else None


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

CLIENT_ERROR: Final = Rule(_A, "client_error")
"""A failure no transport table row matches (a bug of ours, or of a client library)."""

V = TypeVar("V")


def matching_row(exc: BaseException, table: Sequence[tuple[type[BaseException], V]]) -> V | None:
    """The value of the first ``table`` row whose exception type ``exc`` is an instance of."""
    for kind, value in table:
        if isinstance(exc, kind):
            return value
    return None


def classify_exception(exc: BaseException) -> Rule:
    """The rule for a transport failure (see :data:`TRANSPORT_ERRORS`)."""
    return matching_row(exc, TRANSPORT_ERRORS) or CLIENT_ERROR


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


# the adapters ------------------------------------------------------------------------------

INVALID_RECIPIENT: Final = Rule(_P, "invalid_recipient")
NO_PROVIDER_FOR_PLATFORM: Final = Rule(_T, "no_provider_for_platform")
"""A push recipient of a platform the adapter does not send to: retried until it expires
(the router sends each platform to its provider), never failed."""


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

    def _push_target(self, message: OutboundMessage, started: datetime,
                     platforms: frozenset[PushPlatform]) -> PushRecipient | SendResult:
        """The push recipient of ``message``, or the result when this adapter cannot send to
        it (not a push recipient: PERMANENT; a platform outside ``platforms``: TRANSIENT)."""
        recipient = message.recipient
        if not isinstance(recipient, PushRecipient):
            return self._result(INVALID_RECIPIENT, message, started)
        if recipient.platform not in platforms:
            return self._result(NO_PROVIDER_FOR_PLATFORM, message, started,
                                error_code=recipient.platform.value)
        return recipient

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

    Build it with :meth:`open` inside the event loop that will use it. ``send`` never raises
    for provider answers or transport failures; it bounds each call by the caller's timeout.

    Subclasses set ``name`` (= their settings section) and ``_url``, and give :meth:`_headers`
    (the account's request headers), :meth:`_encode` (the request body) and :meth:`_classify`
    (the :class:`SendResult` of an answer), and may give :meth:`_request_headers` (a
    signature per request, SES); :meth:`send` posts one string-addressed message
    and classifies transport failures through :data:`TRANSPORT_ERRORS`. Fully custom senders
    (FCM) use :meth:`_post` directly.
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
    async def open(cls, settings: Settings | C, *, timeout: float | timedelta,
                   connect_timeout: float | timedelta | None = None,
                   max_connections: int = 256,
                   clock: Callable[[], datetime] = utcnow) -> Self:
        """Open a pooled client of the account in ``settings`` (or the settings section
        itself) bound to the running loop.

        ``timeout`` bounds each ``send`` (the tier's ``provider_timeout``); connection set-up,
        including a wait for a free pooled connection, gets ``connect_timeout`` (default half of
        ``timeout``) so that a timeout before anything was sent stays distinguishable
        (TRANSIENT) from one after (AMBIGUOUS). Raises ``ValueError`` when the account's
        credentials are not configured.
        """
        config: C = getattr(settings, cls.name) if isinstance(settings, Settings) else settings
        session = http_session(cls._headers(config), max_connections)
        try:
            return cls(config, session, timeout=seconds(timeout),
                       connect_timeout=None if connect_timeout is None
                       else seconds(connect_timeout), clock=clock)
        except BaseException:
            await session.close()
            raise

    @classmethod
    def _headers(cls, config: C) -> dict[str, str]:
        """The headers every request of the account sends; ``ValueError`` when its
        credentials are not configured."""
        raise NotImplementedError

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

    def _request_headers(self, body: bytes) -> Mapping[str, str] | None:
        """Headers of one request beyond the session's (a per-request signature of
        ``body``); None by default."""
        return None

    async def send(self, message: OutboundMessage, *,
                   timeout: float | timedelta | None = None) -> SendResult:
        """Send one message; ``timeout`` overrides the one given to ``open``."""
        started = self._clock()
        if not isinstance(message.recipient, str):
            return self._result(INVALID_RECIPIENT, message, started)
        limits = self._limits(timeout)
        body = self._encode(message)
        answer = await self._post(self._url, body, limits, message, started,
                                  headers=self._request_headers(body))
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
