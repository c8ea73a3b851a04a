"""Client status webhooks on the Standard Webhooks 1.0 wire format: signing, verification, the
body, and one HTTP delivery attempt.

Signature (symmetric, ``v1``)::

    key     = base64decode(secret without its "whsec_" prefix)       24..64 random bytes
    content = f"{webhook_id}.{timestamp}.{body}"                        timestamp: unix seconds
    header  = " ".join(f"v1,{base64(HMAC-SHA256(key, content))}" for every active secret)

Every request carries ``webhook-id`` (stable across retries and replays: the receiver's
idempotency key), ``webhook-timestamp`` (the time of this attempt) and ``webhook-signature``.

Outcome of one attempt (:func:`classify`): ``2xx`` → delivered; ``410 Gone`` → the receiver
asked us to stop (no further attempt of this webhook); any other answer, a redirect, a
timeout or a connection error → retried on the schedule (Standard Webhooks / Svix: every
non-``2xx`` is a failure). ``Retry-After`` (seconds or an HTTP date) is returned so the
scheduler can wait longer than the schedule.

Before any connection the URL is vetted (``adapters/egress.py``): a URL the egress rules
refuse ends the webhook (:attr:`Verdict.REFUSED`) without a connection attempt; a host that
does not resolve is a failed attempt (``dns_error``); the connection goes to the vetted
addresses only.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson
from pydantic import SecretStr

from notiflow.adapters.egress import Denied, EgressGuard, Vetted, pinned, pinned_connector
from notiflow.adapters.providers.base import Outcome
from notiflow.schemas.enums import Status
from notiflow.schemas.status import rank

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
DEFAULT_TOLERANCE = timedelta(minutes=5)
EVENT_TYPE = "message.status"
USER_AGENT = "notiflow-webhooks/1"

Secret = str | SecretStr


class WebhookVerificationError(ValueError):
    """The request is not a valid, fresh Standard Webhooks request for the given secret(s)."""


# signing -----------------------------------------------------------------------------------


def decode_secret(secret: Secret) -> bytes:
    """The HMAC key of a ``whsec_`` + base64 secret (the prefix is optional); raises
    ``ValueError`` unless it decodes to 24..64 bytes."""
    text = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    text = text.strip().removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("webhook secret is not base64 after its whsec_ prefix") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(f"webhook secret must decode to {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} "
                         f"bytes, not {len(key)}")
    return key


def _timestamp(ts: int | datetime) -> int:
    if isinstance(ts, datetime):
        if ts.tzinfo is None:
            raise ValueError("webhook timestamp must be timezone-aware")
        return int(ts.timestamp())
    return int(ts)


def _body(body: bytes | str) -> bytes:
    return body.encode() if isinstance(body, str) else body


def signature(key: bytes, msg_id: str, timestamp: int | datetime, body: bytes | str) -> str:
    """base64 HMAC-SHA256 of ``{msg_id}.{timestamp}.{body}`` under ``key``."""
    if not msg_id or "." in msg_id:
        raise ValueError("webhook id must be non-empty and contain no '.'")
    content = f"{msg_id}.{_timestamp(timestamp)}.".encode() + _body(body)
    return base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()


def sign(secrets: Sequence[Secret], msg_id: str, timestamp: int | datetime,
         body: bytes | str) -> str:
    """The ``webhook-signature`` header value: one ``v1,<sig>`` per secret, space-separated,
    in the order given (rotation: list the new secret and the old one)."""
    if not secrets:
        raise ValueError("no webhook secret to sign with")
    return " ".join(f"v1,{signature(decode_secret(s), msg_id, timestamp, body)}"
                    for s in secrets)


def signed_headers(secrets: Sequence[Secret], msg_id: str, timestamp: int | datetime,
                   body: bytes | str) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(_timestamp(timestamp)),
            "webhook-signature": sign(secrets, msg_id, timestamp, body)}


def verify(secret: Secret | Sequence[Secret], headers: Mapping[str, str], body: bytes | str,
           tolerance: timedelta = DEFAULT_TOLERANCE, *, now: datetime | None = None) -> None:
    """Check a received webhook (what a client does): the three headers are present, the
    timestamp is within ``tolerance`` of ``now`` and one ``v1`` signature matches one of the
    secrets (constant-time). ``body`` must be the raw bytes as received. Raises
    :class:`WebhookVerificationError`; returns None when valid."""
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, ts, sigs = (lower.get("webhook-id"), lower.get("webhook-timestamp"),
                        lower.get("webhook-signature"))
    if not (msg_id and ts and sigs):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or "
                                       "webhook-signature")
    if not ts.isdigit():
        raise WebhookVerificationError("webhook-timestamp is not an integer")
    sent = datetime.fromtimestamp(int(ts), UTC)
    current = now or datetime.now(UTC)
    if sent < current - tolerance:
        raise WebhookVerificationError("webhook-timestamp too old")
    if sent > current + tolerance:
        raise WebhookVerificationError("webhook-timestamp too new")
    candidates = [secret] if isinstance(secret, str | SecretStr) else list(secret)
    try:
        expected = [base64.b64decode(signature(decode_secret(s), msg_id, int(ts), body))
                    for s in candidates]
    except ValueError as exc:
        raise WebhookVerificationError(str(exc)) from None
    for entry in sigs.split(" "):
        version, _, value = entry.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if any(hmac.compare_digest(given, e) for e in expected):
            return
    raise WebhookVerificationError("no matching signature")


# identities and body -----------------------------------------------------------------------


def per_attempt(status: Status | str) -> bool:
    """True for the statuses a message can take once per send attempt (PROCESSING,
    RETRY_PENDING, UNKNOWN): each attempt's is a status change of its own."""
    s = Status(status)
    return rank(s, 1) != rank(s, 2)


def webhook_id(message_id: str, status: Status | str, attempt: int = 0) -> str:
    """``wh_{message_id}_{STATUS}``, or ``wh_{message_id}_{STATUS}_{attempt}`` for a
    per-attempt status: the same for every delivery attempt and replay of one status change
    (message ids never contain '.')."""
    s = Status(status)
    base = f"wh_{message_id}_{s.value}"
    return f"{base}_{attempt}" if per_attempt(s) else base


def endpoint_id(url: str) -> str:
    """``scheme://host:port`` of an http(s) URL: with the tenant, the unit of the circuit
    breaker (``flows/webhooks/webhook_sender.py``; the path, query and credentials are left out).
    Raises ``ValueError`` for anything else."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("status_webhook must be an absolute http(s) URL")
    port = parts.port or (443 if scheme == "https" else 80)
    host = parts.hostname.lower()
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def status_body(*, message_id: str, status: Status, reason: str | None, attempt: int,
                occurred_at: datetime, tenant_id: str | None) -> bytes:
    """The JSON body (compact, UTC times with ``Z``). It never carries the recipient or the
    content: clients fetch details from the status API."""
    data: dict[str, Any] = {"message_id": message_id, "status": status.value, "reason": reason,
                            "attempt": attempt, "occurred_at": occurred_at.astimezone(UTC)}
    if tenant_id is not None:
        data["tenant_id"] = tenant_id
    return orjson.dumps({"type": EVENT_TYPE, "timestamp": occurred_at.astimezone(UTC),
                         "data": data}, option=orjson.OPT_UTC_Z)


# one delivery attempt ----------------------------------------------------------------------


class Verdict(StrEnum):
    DELIVERED = "delivered"
    """``2xx``: done."""
    RETRY = "retry"
    """Any other answer, a timeout or a connection error: next step of the schedule."""
    GONE = "gone"
    """``410 Gone``: the receiver does not want this webhook; no further attempt."""
    REFUSED = "refused"
    """The egress rules refuse the URL: no connection was attempted, none will be."""


def classify(status_code: int) -> Verdict:
    if 200 <= status_code <= 299:
        return Verdict.DELIVERED
    if status_code == 410:
        return Verdict.GONE
    return Verdict.RETRY


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from a ``Retry-After`` header (delta seconds or HTTP date); None if absent or
    unparseable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        at = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return max(0.0, (at - now).total_seconds())


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one POST came to."""

    verdict: Verdict
    reason: str
    """``http_<code>``, ``timeout``, ``connect_error``, ``connection_error:<Class>``,
    ``internal_error:<Class>``, ``dns_error``, ``url_not_allowed:<kind>``."""
    started_at: datetime
    completed_at: datetime
    status_code: int | None = None
    retry_after_s: float | None = None

    @property
    def latency_s(self) -> float:
        return (self.completed_at - self.started_at).total_seconds()

    def breaker_outcome(self) -> tuple[Outcome, str | None]:
        """For the endpoint's circuit breaker: ``5xx``, timeouts and connection errors are
        failures; ``429`` is throttling; any other answer (``2xx``, ``4xx``, ``3xx``) shows a
        live endpoint and counts as a success."""
        code = self.status_code
        if code == 429:
            return Outcome.TRANSIENT, "rate_limited"
        if code is None or code >= 500:
            return Outcome.TRANSIENT, self.reason
        if self.verdict is Verdict.DELIVERED:
            return Outcome.ACCEPTED, None
        return Outcome.PERMANENT, self.reason


def unreachable(denied: Denied, at: datetime) -> AttemptResult:
    """The result of an attempt that did not connect because ``egress`` denied its URL:
    refused for good, or retried when its host did not resolve."""
    if denied.reason == "unresolvable":
        return AttemptResult(Verdict.RETRY, "dns_error", at, at)
    return AttemptResult(Verdict.REFUSED, f"url_not_allowed:{denied.kind}", at, at)


class WebhookClient:
    """POSTs signed webhooks over one aiohttp session (open it on the loop that uses it) to
    URLs ``egress`` vetted, at the addresses it vetted; :meth:`post` never raises. Redirects
    are not followed (a ``3xx`` is a failure); no proxy from the environment is used."""

    def __init__(self, timeout: timedelta, max_connections: int = 64, *,
                 egress: EgressGuard) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout.total_seconds())
        self.max_connections = max_connections
        self.egress = egress
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> WebhookClient:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, connector=pinned_connector(self.max_connections),
                headers={"user-agent": USER_AGENT, "content-type": "application/json"},
                auto_decompress=False, trust_env=False)
        return self

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def vet(self, url: str) -> Vetted | AttemptResult:
        """``url`` vetted for :meth:`post`, or the result of an attempt that cannot
        connect (:func:`unreachable`)."""
        verdict = await self.egress.vet(url)
        if isinstance(verdict, Denied):
            return unreachable(verdict, datetime.now(UTC))
        return verdict

    async def post(self, url: str | Vetted, msg_id: str, body: bytes,
                   secrets: Sequence[Secret]) -> AttemptResult:
        """One attempt, signed with every secret at the current time, to a URL vetted now
        (a ``str``) or already (:meth:`vet`)."""
        started = datetime.now(UTC)
        try:
            target = await self.vet(url) if isinstance(url, str) else url
            if isinstance(target, AttemptResult):
                return target
            session = (await self.open())._session
            assert session is not None
            headers = signed_headers(secrets, msg_id, int(time.time()), body)
            with pinned(target):
                async with session.post(target.url, data=body, headers=headers,
                                        allow_redirects=False) as resp:
                    code = resp.status
                    after = retry_after(resp.headers.get("retry-after"),
                                        datetime.now(UTC))
        except TimeoutError:
            return AttemptResult(Verdict.RETRY, "timeout", started, datetime.now(UTC))
        except aiohttp.ClientConnectorError:
            return AttemptResult(Verdict.RETRY, "connect_error", started, datetime.now(UTC))
        except aiohttp.ClientError as exc:
            return AttemptResult(Verdict.RETRY, f"connection_error:{type(exc).__name__}",
                                 started, datetime.now(UTC))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return AttemptResult(Verdict.RETRY, f"internal_error:{type(exc).__name__}",
                                 started, datetime.now(UTC))
        return AttemptResult(classify(code), f"http_{code}", started, datetime.now(UTC),
                             status_code=code, retry_after_s=after)
