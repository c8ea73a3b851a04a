"""Twilio Programmable Messaging emulator (``notiflow fakes``; dev, tests, benchmarks).

Serves ``POST /twilio/2010-04-01/Accounts/{AccountSid}/Messages.json`` on Twilio's wire format:
HTTP Basic auth checked against the configured account, form fields ``To``/``From``/``Body``/
``StatusCallback``, Twilio's test "magic numbers", Twilio's error bodies, a realistic Message
resource on success, and signed asynchronous status callbacks (``sent`` then ``delivered`` or
``undelivered``). Latency, error mix, outages, 429 + Retry-After and accepted-then-hang are
knobs that can be changed at runtime over ``/_admin/twilio/config``. Every request to the
Messages endpoint is recorded (the newest ``max_records``), recipient included: this is test
infrastructure, never a production component.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import heapq
import hmac
import itertools
import logging
import os
import random
import re
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any, Final, Literal
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import aiohttp
import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from notiflow.adapters.providers.common import sms_segments as segments
from notiflow.adapters.providers.twilio import API_VERSION, signature
from notiflow.settings import Settings

log = logging.getLogger(__name__)

PREFIX: Final = "/twilio"
_E164 = re.compile(r"\+[1-9][0-9]{1,14}")

MAGIC_TO: Final[Mapping[str, tuple[int, str]]] = {
    "+15005550001": (21211, "Invalid 'To' Phone Number: {to}"),
    "+15005550002": (21612, "The 'To' phone number: {to}, is not currently reachable using the "
                            "'From' phone number: {from_} via SMS."),
    "+15005550003": (21408, "Permission to send an SMS has not been enabled for the region "
                            "indicated by the 'To' number: {to}."),
    "+15005550004": (21610, "Attempt to send to unsubscribed recipient"),
    "+15005550009": (21614, "'To' number {to} is not a valid mobile number"),
}
"""Twilio's documented test ``To`` numbers and the error each one returns (HTTP 400)."""

MAGIC_FROM: Final[Mapping[str, tuple[int, str]]] = {
    "+15005550001": (21212, "The 'From' number {from_} is not a valid phone number, shortcode, "
                            "or alphanumeric sender ID."),
    "+15005550007": (21606, "The 'From' phone number provided is not a valid, message-capable "
                            "Twilio phone number."),
    "+15005550008": (21611, "This 'From' number has exceeded the maximum number of queued "
                            "messages"),
}
"""Twilio's documented test ``From`` numbers and the error each one returns (HTTP 400)."""

MAX_BODY_CHARS: Final = 1600

def error_body(code: int, message: str, status: int) -> bytes:
    """Twilio's JSON error body."""
    return orjson.dumps({"code": code, "message": message,
                         "more_info": f"https://www.twilio.com/docs/errors/{code}",
                         "status": status})


class TwilioKnobs(BaseModel):
    """Runtime behaviour of the emulator; every field can be changed over the admin API."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_ms: float = Field(0.0, ge=0)
    """Mean added response latency."""
    latency_jitter_ms: float = Field(0.0, ge=0)
    """Latency is uniform in ``latency_ms ± latency_jitter_ms`` (never below 0)."""
    error_rate_5xx: float = Field(0.0, ge=0, le=1)
    """Share of requests answered with a status drawn evenly from ``statuses_5xx``."""
    statuses_5xx: tuple[Literal[500, 503], ...] = Field((500, 503), min_length=1)
    """500 (code 20500) and/or 503 (code 20503)."""
    error_rate_429: float = Field(0.0, ge=0, le=1)
    """Share of requests answered 429 (20429) with ``Retry-After: retry_after_s``."""
    retry_after_s: float = Field(1.0, ge=0)
    outage: bool = False
    """Every request answered 503 (20503), before authentication."""
    timeout_rate: float = Field(0.0, ge=0, le=1)
    """Share of valid requests accepted (recorded, callbacks scheduled) but answered only after
    ``hang_s``: longer than any client timeout."""
    hang_s: float = Field(30.0, ge=0, le=3600)
    callbacks_enabled: bool = True
    callback_delay_ms: float = Field(50.0, ge=0)
    """Delay before the ``sent`` callback; the final callback follows after the same delay."""
    undelivered_rate: float = Field(0.0, ge=0, le=1)
    """Share of accepted messages whose final callback is ``undelivered`` (ErrorCode 30003)."""
    max_records: int = Field(1_000_000, ge=1, le=20_000_000)
    """Records retained (oldest evicted first); about 0.6 KB each."""


ACCEPTED: Final = "accepted"


@dataclass(slots=True)
class MessageRecord:
    """One request to the Messages endpoint, as the emulator saw it."""

    received_at: float
    outcome: str
    status: int
    error_code: int | None
    sid: str | None
    message_id: str | None
    attempt: int | None
    to: str | None
    from_: str | None
    body: str | None
    hang: bool = False
    """Accepted, then answered only after ``hang_s`` (the accepted-then-timeout case)."""

    @property
    def accepted(self) -> bool:
        return self.outcome == ACCEPTED

    def as_json(self) -> dict[str, Any]:
        return {"received_at": self.received_at, "outcome": self.outcome,
                "status": self.status, "error_code": self.error_code, "sid": self.sid,
                "message_id": self.message_id, "attempt": self.attempt, "to": self.to,
                "from": self.from_, "body": self.body, "hang": self.hang}


class MessageLog:
    """The newest ``max_records`` records, indexed by message_id, plus exact lifetime counters.

    ``duplicates`` and the per-message_id histogram cover the retained window only.
    """

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self.records: deque[MessageRecord] = deque()
        self.by_message_id: dict[str, list[MessageRecord]] = {}
        self.accepted_histogram: Counter[int] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.received = 0
        self.accepted = 0
        self.hung = 0

    def resize(self, max_records: int) -> None:
        """Retain at most ``max_records`` from now on, evicting the oldest at once."""
        self.max_records = max_records
        while len(self.records) > max_records:
            self._evict(self.records.popleft())

    def add(self, record: MessageRecord) -> None:
        if len(self.records) >= self.max_records:
            self._evict(self.records.popleft())
        self.records.append(record)
        self.received += 1
        self.outcomes[record.outcome] += 1
        if record.accepted:
            self.accepted += 1
            self.hung += record.hang
        mid = record.message_id
        if mid is None:
            return
        same = self.by_message_id.get(mid)
        if same is None:
            self.by_message_id[mid] = [record]
            self.accepted_histogram[int(record.accepted)] += 1
            return
        before = sum(r.accepted for r in same)
        same.append(record)
        if record.accepted:
            self.accepted_histogram[before] -= 1
            self.accepted_histogram[before + 1] += 1

    def _evict(self, record: MessageRecord) -> None:
        mid = record.message_id
        if mid is None:
            return
        same = self.by_message_id[mid]
        before = sum(r.accepted for r in same)
        same.pop(0)
        self.accepted_histogram[before] -= 1
        if same:
            self.accepted_histogram[before - int(record.accepted)] += 1
        else:
            del self.by_message_id[mid]

    def find(self, *, message_id: str | None = None, sid: str | None = None,
             limit: int | None = None) -> list[MessageRecord]:
        """Matching records, oldest first; with ``limit``, only the newest ``limit``."""
        found: list[MessageRecord]
        if message_id is not None:
            found = self.by_message_id.get(message_id, [])
            if sid is not None:
                found = [r for r in found if r.sid == sid]
        elif sid is not None:
            found = [r for r in self.records if r.sid == sid]
        elif limit is not None:
            return list(itertools.islice(reversed(self.records), limit))[::-1]
        else:
            found = list(self.records)
        return found[-limit:] if limit is not None else list(found)

    def stats(self) -> dict[str, Any]:
        histogram = {str(k): v for k, v in sorted(self.accepted_histogram.items()) if v}
        return {
            "received": self.received,
            "accepted": self.accepted,
            "hung": self.hung,
            "rejected": self.received - self.accepted,
            "duplicates": sum(v for k, v in self.accepted_histogram.items() if k >= 2),
            "by_outcome": dict(self.outcomes),
            "by_message_id": {"distinct": len(self.by_message_id),
                              "accepted_histogram": histogram},
            "retained": len(self.records),
        }


class CallbackDispatcher:
    """Delivers signed status callbacks at their due time with bounded concurrency and a
    bounded backlog. Delivery failures are counted and logged (throttled), never raised."""

    def __init__(self, auth_token: str, *, concurrency: int = 64,
                 max_pending: int = 200_000) -> None:
        self._token = auth_token
        self._heap: list[tuple[float, int, str, dict[str, str]]] = []
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(concurrency)
        self._max_pending = max_pending
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._last_failure_log = -1e9
        self.counts: Counter[str] = Counter()

    def schedule(self, due: float, url: str, params: dict[str, str]) -> None:
        """Queue one callback for ``due`` (``time.monotonic`` seconds)."""
        if len(self._heap) >= self._max_pending:
            self.counts["dropped"] += 1
            return
        item = (due, next(self._seq), url, params)
        heapq.heappush(self._heap, item)
        self.counts["scheduled"] += 1
        if self._heap[0] is item:
            self._wakeup.set()

    def clear(self) -> None:
        self._heap.clear()
        self.counts.clear()

    def stats(self) -> dict[str, int]:
        return {"scheduled": self.counts["scheduled"], "sent": self.counts["sent"],
                "failed": self.counts["failed"], "dropped": self.counts["dropped"],
                "pending": len(self._heap)}

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=5.0),
            headers={"User-Agent": "TwilioProxy/1.1"},
        )
        self._runner = asyncio.create_task(self._run(), name="twilio-callbacks")

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            if not self._heap:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            delay = self._heap[0][0] - time.monotonic()
            if delay > 0:
                self._wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), delay)
                continue
            _, _, url, params = heapq.heappop(self._heap)
            await self._slots.acquire()
            task = asyncio.create_task(self._deliver(url, params))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _deliver(self, url: str, params: dict[str, str]) -> None:
        try:
            assert self._session is not None
            headers = {"X-Twilio-Signature": signature(self._token, url, params),
                       "Content-Type": "application/x-www-form-urlencoded"}
            async with self._session.post(url, data=urlencode(params), headers=headers) as resp:
                await resp.read()
                ok = 200 <= resp.status < 300
                problem = f"HTTP {resp.status}"
        except Exception as exc:
            ok, problem = False, f"{type(exc).__name__}: {exc}"
        finally:
            self._slots.release()
        if ok:
            self.counts["sent"] += 1
            return
        self.counts["failed"] += 1
        now = time.monotonic()
        if now - self._last_failure_log >= 10.0:
            self._last_failure_log = now
            log.warning("twilio status callback to %s failed (%s); %d failures so far",
                        urlsplit(url)._replace(query="").geturl(), problem,
                        self.counts["failed"])


class _Clock:
    """Wall-clock seconds and the RFC 2822 date Twilio uses, cached per second."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def rfc2822(self, now: float) -> str:
        second = int(now)
        if second != self._second:
            self._second = second
            self._text = format_datetime(datetime.fromtimestamp(second, UTC))
        return self._text


class TwilioEmulator:
    """State and handlers of the Twilio emulator (one configured account)."""

    def __init__(self, settings: Settings, *, rng: random.Random | None = None) -> None:
        config = settings.twilio
        self.account_sid = config.account_sid
        token = config.auth_token.get_secret_value() if config.auth_token else None
        self._expected_auth = (
            "Basic " + base64.b64encode(f"{config.account_sid}:{token}".encode()).decode()
            if token else None)
        self.knobs = TwilioKnobs()
        self.messages = MessageLog(self.knobs.max_records)
        self.callbacks = CallbackDispatcher(token or "")
        self._rng = rng or random.Random()
        self._clock = _Clock()
        self._unauthorized = error_body(20003, "Authenticate", 401)
        self._too_many = error_body(20429, "Too Many Requests", 429)
        self._internal = error_body(20500, "Internal Server Error", 500)
        self._unavailable = error_body(20503, "Service Unavailable", 503)
        if token is None:
            log.warning("twilio emulator: no auth token configured "
                        "(NOTIFLOW_TWILIO__AUTH_TOKEN); every request will get 401")

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post(f"{PREFIX}/{API_VERSION}/Accounts/{{account_sid}}/Messages.json",
                     self.create_message),
            web.get("/_admin/twilio/config", self.get_config),
            web.post("/_admin/twilio/config", self.set_config),
            web.get("/_admin/twilio/messages", self.list_messages),
            web.get("/_admin/twilio/stats", self.get_stats),
            web.post("/_admin/twilio/reset", self.reset_handler),
        ]

    async def lifecycle(self, _app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx`` hook: runs the callback dispatcher while the app runs."""
        await self.callbacks.start()
        yield
        await self.callbacks.stop()

    def reset(self) -> None:
        """Forget every record, pending callback and knob."""
        self.knobs = TwilioKnobs()
        self.messages = MessageLog(self.knobs.max_records)
        self.callbacks.clear()

    # Messages endpoint -----------------------------------------------------------------

    async def create_message(self, request: web.Request) -> web.Response:
        received_at = time.time()
        knobs = self.knobs
        try:
            form = dict(parse_qsl((await request.read()).decode(), keep_blank_values=True))
        except UnicodeDecodeError:
            form = {}
        to, from_, body = form.get("To"), form.get("From"), form.get("Body")
        callback = form.get("StatusCallback") or None
        message_id, attempt = _correlation(callback)

        def record(outcome: str, status: int, code: int | None = None,
                   sid: str | None = None, hang: bool = False) -> None:
            self.messages.add(MessageRecord(received_at, outcome, status, code, sid, message_id,
                                       attempt, to, from_, body, hang))

        if knobs.latency_ms or knobs.latency_jitter_ms:
            jitter = knobs.latency_jitter_ms
            delay = knobs.latency_ms + (self._rng.uniform(-jitter, jitter) if jitter else 0.0)
            if delay > 0:
                await asyncio.sleep(delay / 1000)
        rng = self._rng.random
        if knobs.outage:
            record("outage", 503, 20503)
            return _json(self._unavailable, 503)
        auth = request.headers.get("Authorization")
        if (self._expected_auth is None or auth is None
                or not _same(auth, self._expected_auth)):
            record("unauthorized", 401, 20003)
            return _json(self._unauthorized, 401,
                         {"WWW-Authenticate": 'Basic realm="Twilio API"'})
        path_sid = request.match_info["account_sid"]
        if path_sid != self.account_sid:
            record("invalid", 404, 20404)
            return _json(error_body(20404, f"The requested resource {request.path} was not "
                                    "found", 404), 404)
        if knobs.error_rate_429 and rng() < knobs.error_rate_429:
            record("rate_limited", 429, 20429)
            return _json(self._too_many, 429, {"Retry-After": _retry_after(knobs.retry_after_s)})
        if knobs.error_rate_5xx and rng() < knobs.error_rate_5xx:
            if self._rng.choice(knobs.statuses_5xx) == 500:
                record("server_error", 500, 20500)
                return _json(self._internal, 500)
            record("server_error", 503, 20503)
            return _json(self._unavailable, 503)
        invalid = _validate(to, from_, body)
        if invalid is not None:
            code, message = invalid
            record("invalid", 400, code)
            return _json(error_body(code, message, 400), 400)
        assert to is not None and from_ is not None and body is not None
        sid = "SM" + os.urandom(16).hex()
        hang = bool(knobs.timeout_rate) and rng() < knobs.timeout_rate
        record(ACCEPTED, 201, sid=sid, hang=hang)
        if callback is not None and knobs.callbacks_enabled:
            self._schedule_callbacks(knobs, callback, sid, to, from_)
        date = self._clock.rfc2822(received_at)
        uri = f"/{API_VERSION}/Accounts/{self.account_sid}/Messages/{sid}"
        resource = orjson.dumps({
            "account_sid": self.account_sid, "api_version": API_VERSION, "body": body,
            "date_created": date, "date_sent": None, "date_updated": date,
            "direction": "outbound-api", "error_code": None, "error_message": None,
            "from": from_, "messaging_service_sid": None, "num_media": "0",
            "num_segments": str(segments(body)), "price": None, "price_unit": "USD",
            "sid": sid, "status": "queued",
            "subresource_uris": {"media": f"{uri}/Media.json"}, "to": to,
            "uri": f"{uri}.json",
        })
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return _json(resource, 201)

    def _schedule_callbacks(self, knobs: TwilioKnobs, url: str, sid: str, to: str,
                            from_: str) -> None:
        delay = knobs.callback_delay_ms / 1000
        now = time.monotonic()
        common = {"AccountSid": self.account_sid, "ApiVersion": API_VERSION, "From": from_,
                  "MessageSid": sid, "SmsSid": sid, "To": to}
        self.callbacks.schedule(now + delay, url,
                                {**common, "MessageStatus": "sent", "SmsStatus": "sent"})
        if knobs.undelivered_rate and self._rng.random() < knobs.undelivered_rate:
            final = {**common, "MessageStatus": "undelivered", "SmsStatus": "undelivered",
                     "ErrorCode": "30003"}
        else:
            final = {**common, "MessageStatus": "delivered", "SmsStatus": "delivered"}
        self.callbacks.schedule(now + 2 * delay, url, final)

    # admin -----------------------------------------------------------------------------

    async def get_config(self, _request: web.Request) -> web.Response:
        return _json(orjson.dumps(self.knobs.model_dump()), 200)

    async def set_config(self, request: web.Request) -> web.Response:
        """Merge the given knobs into the current ones; 400 (nothing changed) if invalid."""
        try:
            patch = orjson.loads(await request.read())
            if not isinstance(patch, dict):
                raise ValueError("body must be a JSON object")
            knobs = TwilioKnobs.model_validate({**self.knobs.model_dump(), **patch})
        except (ValueError, ValidationError) as exc:
            return _json(orjson.dumps({"error": str(exc)}), 400)
        self.knobs = knobs
        if knobs.max_records != self.messages.max_records:
            self.messages.resize(knobs.max_records)
        log.info("twilio emulator knobs: %s", self.knobs.model_dump())
        return _json(orjson.dumps(self.knobs.model_dump()), 200)

    async def list_messages(self, request: web.Request) -> web.Response:
        """Retained records, oldest first, filtered by ``message_id`` and/or ``sid``; all of them
        unless ``limit`` (the newest ``limit``) is given."""
        query = request.query
        try:
            limit = max(int(query["limit"]), 1) if "limit" in query else None
        except ValueError:
            return _json(orjson.dumps({"error": "limit must be an integer"}), 400)
        found = self.messages.find(message_id=query.get("message_id"), sid=query.get("sid"),
                              limit=limit)
        return _json(orjson.dumps([r.as_json() for r in found]), 200)

    async def get_stats(self, _request: web.Request) -> web.Response:
        return _json(orjson.dumps({**self.messages.stats(), "callbacks": self.callbacks.stats()}),
                     200)

    async def reset_handler(self, _request: web.Request) -> web.Response:
        self.reset()
        return _json(b'{"reset":true}', 200)


def _validate(to: str | None, from_: str | None, body: str | None) -> tuple[int, str] | None:
    if not to:
        return 21604, "A 'To' phone number is required."
    if not from_:
        return 21603, "A 'From' phone number is required."
    if not body:
        return 21602, "Message body is required."
    if len(body) > MAX_BODY_CHARS:
        return 21617, "The concatenated message body exceeds the 1600 character limit."
    magic = MAGIC_FROM.get(from_)
    if magic is not None:
        return magic[0], magic[1].format(to=to, from_=from_)
    if not _E164.fullmatch(to):
        return 21211, f"Invalid 'To' Phone Number: {to}"
    magic = MAGIC_TO.get(to)
    if magic is not None:
        return magic[0], magic[1].format(to=to, from_=from_)
    return None


def _correlation(callback: str | None) -> tuple[str | None, int | None]:
    if not callback:
        return None, None
    query = parse_qs(urlsplit(callback).query)
    message_id = query.get("message_id", [None])[0]
    attempt = query.get("attempt", [None])[0]
    try:
        return message_id, int(attempt) if attempt is not None else None
    except ValueError:
        return message_id, None


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _retry_after(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else f"{seconds:g}"


def _json(body: bytes, status: int, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json",
                        headers=headers)
