"""Apple Push Notification service emulator: HTTP/2 over TLS on its own port (``notiflow
fakes``; dev, tests, benchmarks).

The APNs provider API is HTTP/2-only, so this emulator is a small ``h2`` server on asyncio
listening on ``fakes_host:fakes_apns_port`` with TLS (certificate and key from
``fakes_apns_cert_file`` / ``fakes_apns_key_file``; ALPN must select ``h2``, as with Apple). Its
admin API (``/_admin/apns/...``) is served by the HTTP admin app with the other emulators.

``POST /3/device/{token}`` is checked the way APNs checks it: the provider token (ES256 JWT;
checked by :func:`verify_provider_token` with PyJWT, not adapter code) must verify with the
public half of ``apns.private_key`` (derived from the same settings), name ``apns.key_id`` as
``kid`` and ``apns.team_id`` as ``iss``, and have an integer ``iat`` at most
one hour old (403 ``ExpiredProviderToken``; anything else wrong is 403
``InvalidProviderToken``, none at all ``MissingProviderToken``). A connection that switches to
a newer token less than ``token_update_min_s`` after its previous one gets 429
``TooManyProviderTokenUpdates``. Then the topic, push type, priority, expiration, apns-id,
collapse id, device token (64 to 200 hex digits) and payload (1 to 4096 bytes) are validated, and
magic device tokens provoke Apple's errors (:data:`MAGIC_TOKENS`). Every request to the device
endpoint is recorded (the newest ``max_records``), device token included: test infrastructure
only. APNs has no delivery callbacks, so neither has the emulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

import jwt
import orjson
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import H2Error
from h2.settings import SettingCodes
from h2.settings import Settings as H2Settings
from pydantic import Field

from notiflow.fakes.common import ACCEPTED, CommonKnobs, Emulator, MessageRecord, json_response
from notiflow.providers.apns.client import MAX_COLLAPSE_ID_BYTES, MAX_PAYLOAD_BYTES
from notiflow.providers.apns.tokens import load_signing_key
from notiflow.settings import Settings

log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS: Final = 1000
TOKEN_MAX_AGE_S: Final = 3600
CLOCK_SKEW_S: Final = 300
PUSH_TYPES: Final = frozenset({"alert", "background", "location", "voip", "complication",
                               "fileprovider", "mdm", "liveactivity", "pushtotalk",
                               "widgets", "controls"})
PRIORITIES: Final = frozenset({"1", "5", "10"})
_PATH = re.compile(r"/3/device/([^/?]*)")
_DEVICE_TOKEN = re.compile(r"[0-9a-fA-F]{64,200}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_UNIQUE_HEADERS = frozenset({"apns-id", "apns-topic", "apns-push-type", "apns-priority",
                             "apns-expiration", "apns-collapse-id", "authorization"})

MAGIC_TOKENS: Final[Mapping[str, tuple[int, str]]] = {
    "bad0": (400, "BadDeviceToken"),
    "dead": (410, "Unregistered"),
    "deac": (410, "ExpiredToken"),
    "f0f0": (400, "DeviceTokenNotForTopic"),
    "aaaa": (429, "TooManyRequests"),
}
"""Device-token prefix (emulator only) → (HTTP status, reason). An all-zero token is also 410
``Unregistered``."""


class ApnsKnobs(CommonKnobs):
    """Runtime behaviour of the APNs emulator (the common knobs apply to the device endpoint;
    APNs sends no ``Retry-After``, so ``retry_after_s`` has no effect here)."""

    token_update_min_s: float = Field(1200.0, ge=0, le=3600)
    """Least spacing (by ``iat``) of provider-token updates on one connection; 0 = unchecked."""


@dataclass(slots=True)
class ApnsRecord(MessageRecord):
    """One request to the device endpoint; ``sid`` is the ``apns-id`` answered, ``to`` the
    device token, ``from`` the ``apns-topic``, ``body``/``title`` the alert."""

    title: str | None = None
    priority: str | None = None
    push_type: str | None = None
    expiration: str | None = None
    collapse_id: str | None = None
    error: str | None = None
    """APNs ``reason`` of a refused request."""


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP/2 request as the emulator received it."""

    method: str
    path: str
    headers: Mapping[str, str]
    duplicated: frozenset[str]
    body: bytes
    truncated: bool
    """The body was longer than the emulator keeps (always refused as too large)."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    apns_id: str
    body: bytes = b""


@dataclass(slots=True)
class _Alert:
    title: str | None = None
    body: str | None = None
    message_id: str | None = None
    attempt: int | None = None


def _alert(raw: bytes) -> _Alert:
    try:
        payload = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        return _Alert()
    if not isinstance(payload, dict):
        return _Alert()
    found = _Alert()
    aps = payload.get("aps")
    alert = aps.get("alert") if isinstance(aps, dict) else None
    if isinstance(alert, dict):
        found.title = alert["title"] if isinstance(alert.get("title"), str) else None
        found.body = alert["body"] if isinstance(alert.get("body"), str) else None
    elif isinstance(alert, str):
        found.body = alert
    if isinstance(payload.get("message_id"), str):
        found.message_id = payload["message_id"]
    attempt = payload.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool):
        found.attempt = attempt
    elif isinstance(attempt, str) and attempt.isdigit():
        found.attempt = int(attempt)
    return found


def error_body(reason: str, *, timestamp_ms: int | None = None) -> bytes:
    """APNs' JSON error body (``timestamp`` in milliseconds on 410)."""
    body: dict[str, Any] = {"reason": reason}
    if timestamp_ms is not None:
        body["timestamp"] = timestamp_ms
    return orjson.dumps(body)


def _public_key(settings: Settings) -> ec.EllipticCurvePublicKey | None:
    config = settings.apns
    if config.private_key is None or not config.team_id or not config.key_id:
        return None
    try:
        return load_signing_key(config.private_key.get_secret_value()).public_key()
    except ValueError:
        log.warning("apns emulator: apns.private_key is not an EC P-256 key")
        return None


def verify_provider_token(token: str, key: ec.EllipticCurvePublicKey, *, key_id: str,
                          team_id: str) -> int:
    """The ``iat`` of a provider token APNs accepts apart from its age: PyJWT verifies the
    ES256 signature by ``key`` and ``iss`` = ``team_id``; the header's ``kid`` must be
    ``key_id`` and ``iat`` an integer at most :data:`CLOCK_SKEW_S` in the future. Anything else
    raises ``jwt.InvalidTokenError``. The caller checks the age on every request."""
    decoded = jwt.decode_complete(
        token, key, algorithms=["ES256"], issuer=team_id, leeway=CLOCK_SKEW_S,
        options={"require": ["iss", "iat"], "verify_exp": False, "verify_nbf": False,
                 "verify_aud": False, "verify_sub": False, "verify_jti": False})
    iat = decoded["payload"].get("iat")
    if decoded["header"].get("kid") != key_id:
        raise jwt.InvalidTokenError("kid is not the team key")
    if not isinstance(iat, int) or isinstance(iat, bool):
        raise jwt.InvalidIssuedAtError("iat is not an integer")
    return iat


@dataclass(slots=True)
class TokenState:
    """The provider token a connection currently uses."""

    value: str | None = None
    iat: int = 0


class ApnsEmulator(Emulator[ApnsKnobs]):
    """State and handlers of the APNs emulator (one team key, one app topic)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__("apns", ApnsKnobs)
        config = settings.apns
        self.team_id = config.team_id
        self.key_id = config.key_id
        self.topic = config.topic
        self.host = settings.fakes_host
        self.port = settings.fakes_apns_port
        self.cert_file = settings.fakes_apns_cert_file
        self.key_file = settings.fakes_apns_key_file
        self._public_key = _public_key(settings)
        self._verified: dict[str, int] = {}
        """Provider tokens whose signature and claims verified → their ``iat``."""
        self._expired: set[str] = set()
        self.token_counts: Counter[str] = Counter()
        self.connections: set[H2Protocol] = set()
        self.connections_opened = 0
        self._server: asyncio.Server | None = None
        if self._public_key is None:
            log.warning("apns emulator: no provider key configured (NOTIFLOW_APNS__TEAM_ID, "
                        "NOTIFLOW_APNS__KEY_ID, NOTIFLOW_APNS__PRIVATE_KEY); every request "
                        "will be refused")

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/_admin/apns/expire-tokens", self.expire_tokens),
                web.post("/_admin/apns/drop-connections", self.drop_connections),
                *self.admin_routes()]

    def reset(self) -> None:
        super().reset()
        self._verified.clear()
        self._expired.clear()
        self.token_counts.clear()
        self.connections_opened = 0
        for connection in self.connections:
            connection.token = TokenState()

    def extra_stats(self) -> dict[str, Any]:
        counts = self.token_counts
        return {
            "connections": {"opened": self.connections_opened, "open": len(self.connections)},
            "token": {"verified": counts["verified"], "updates": counts["updates"],
                      "rejected": counts["rejected"], "expired": len(self._expired),
                      "by_error": {k.removeprefix("error:"): v for k, v in counts.items()
                                   if k.startswith("error:")}},
        }

    async def expire_tokens(self, _request: web.Request) -> web.Response:
        """Treat every provider token seen so far as expired (as APNs does after an hour)."""
        fresh = set(self._verified) - self._expired
        self._expired.update(fresh)
        return json_response(orjson.dumps({"expired": len(fresh)}), 200)

    async def drop_connections(self, _request: web.Request) -> web.Response:
        """Abort every HTTP/2 connection at once (requests in flight get no answer)."""
        dropped = list(self.connections)
        for connection in dropped:
            connection.abort()
        return json_response(orjson.dumps({"dropped": len(dropped)}), 200)

    # listener ---------------------------------------------------------------------------

    def tls_context(self) -> ssl.SSLContext | None:
        """The server TLS context (TLS 1.2+, ALPN ``h2``); None when no certificate is
        configured."""
        if self.cert_file is None or self.key_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        context.set_alpn_protocols(["h2"])
        return context

    async def start(self) -> None:
        """Listen on ``fakes_host:fakes_apns_port`` (nothing when TLS is not configured)."""
        context = self.tls_context()
        if context is None:
            log.warning("apns emulator: no TLS certificate (NOTIFLOW_FAKES_APNS_CERT_FILE, "
                        "NOTIFLOW_FAKES_APNS_KEY_FILE); not listening")
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: H2Protocol(self), self.host, self.port,
                                                ssl=context, backlog=2048, reuse_address=True)
        log.info("apns emulator listening on https://%s:%d (HTTP/2)", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and drop every connection (streams still hanging are abandoned)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for connection in list(self.connections):
            connection.abort()
        await server.wait_closed()

    async def lifecycle(self, _app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx`` hook: the HTTP/2 listener runs while the admin app runs."""
        await self.start()
        yield
        await self.stop()

    # the device endpoint ----------------------------------------------------------------

    def authorize(self, connection: TokenState, header: str | None) -> tuple[int, str] | None:
        """(status, reason) refusing the ``authorization`` header on ``connection``; None
        when the provider token is good (it becomes the connection's token)."""
        if not header or header[:7].lower() != "bearer ":
            return 403, "MissingProviderToken"
        token = header[7:].strip()
        iat = self._verified.get(token)
        if iat is None:
            iat = self._verify(token)
            if iat is None:
                return 403, "InvalidProviderToken"
        now = time.time()
        if token in self._expired or now - iat > TOKEN_MAX_AGE_S:
            return 403, "ExpiredProviderToken"
        if connection.value != token:
            spacing = self.knobs.token_update_min_s
            if (connection.value is not None and connection.value not in self._expired
                    and spacing and connection.iat < iat < connection.iat + spacing):
                return 429, "TooManyProviderTokenUpdates"
            connection.value, connection.iat = token, iat
            self.token_counts["updates"] += 1
        return None

    def _verify(self, token: str) -> int | None:
        if self._public_key is None or not self.key_id or not self.team_id:
            return None
        try:
            iat = verify_provider_token(token, self._public_key, key_id=self.key_id,
                                        team_id=self.team_id)
        except jwt.InvalidTokenError:
            return None
        if len(self._verified) >= 10_000:
            self._verified = {k: v for k, v in self._verified.items() if k in self._expired}
        self._verified[token] = iat
        self.token_counts["verified"] += 1
        return iat

    def _validate(self, request: Request, device_token: str) -> tuple[int, str] | None:
        """(status, reason) of an invalid notification request; None when valid."""
        headers = request.headers
        if request.duplicated & _UNIQUE_HEADERS:
            return 400, "DuplicateHeaders"
        if not device_token:
            return 400, "MissingDeviceToken"
        topic = headers.get("apns-topic")
        if not topic:
            return 400, "MissingTopic"
        if topic != self.topic:
            return 400, "TopicDisallowed"
        if headers.get("apns-push-type") not in PUSH_TYPES:
            return 400, "InvalidPushType"
        if "apns-priority" in headers and headers["apns-priority"] not in PRIORITIES:
            return 400, "BadPriority"
        if "apns-expiration" in headers and not headers["apns-expiration"].isdigit():
            return 400, "BadExpirationDate"
        if "apns-id" in headers and not _UUID.fullmatch(headers["apns-id"]):
            return 400, "BadMessageId"
        if len(headers.get("apns-collapse-id", "").encode()) > MAX_COLLAPSE_ID_BYTES:
            return 400, "BadCollapseId"
        if not _DEVICE_TOKEN.fullmatch(device_token):
            return 400, "BadDeviceToken"
        if not request.body:
            return 400, "PayloadEmpty"
        if request.truncated or len(request.body) > MAX_PAYLOAD_BYTES:
            return 413, "PayloadTooLarge"
        if set(device_token) == {"0"}:
            return 410, "Unregistered"
        return next((v for k, v in MAGIC_TOKENS.items() if device_token.lower().startswith(k)),
                    None)

    async def answer(self, connection: TokenState, request: Request) -> Answer:
        """The answer to one request on ``connection`` (records it first)."""
        received_at = time.time()
        knobs = self.knobs
        headers = request.headers
        given_id = headers.get("apns-id", "")
        answer_id = given_id.lower() if _UUID.fullmatch(given_id) else str(uuid.uuid4())
        match = _PATH.fullmatch(request.path) if request.method == "POST" else None
        device_token = match.group(1) if match else None
        alert = _alert(request.body)

        def record(outcome: str, status: int, *, error: str | None = None,
                   hang: bool = False) -> None:
            self.messages.add(ApnsRecord(
                received_at, outcome, status, None, answer_id, alert.message_id, alert.attempt,
                device_token, headers.get("apns-topic"), alert.body, hang, title=alert.title,
                priority=headers.get("apns-priority"), push_type=headers.get("apns-push-type"),
                expiration=headers.get("apns-expiration"),
                collapse_id=headers.get("apns-collapse-id"), error=error))

        def refuse(outcome: str, status: int, reason: str) -> Answer:
            record(outcome, status, error=reason)
            stamp = int(received_at * 1000) if status == 410 else None
            return Answer(status, answer_id, error_body(reason, timestamp_ms=stamp))

        await self.added_latency(knobs)
        if knobs.outage:
            return refuse("outage", 503, "ServiceUnavailable")
        if request.method != "POST":
            return refuse("invalid", 405, "MethodNotAllowed")
        if device_token is None:
            return refuse("invalid", 404, "BadPath")
        refused = self.authorize(connection, headers.get("authorization"))
        if refused is not None:
            status, reason = refused
            self.token_counts["rejected"] += 1
            self.token_counts[f"error:{reason}"] += 1
            return refuse("unauthorized" if status == 403 else "rate_limited", status, reason)
        if self.draw(knobs.error_rate_429):
            return refuse("rate_limited", 429, "TooManyRequests")
        if self.draw(knobs.error_rate_5xx):
            status = self.rng.choice(knobs.statuses_5xx)
            return refuse("server_error", status,
                          "InternalServerError" if status == 500 else "ServiceUnavailable")
        invalid = self._validate(request, device_token)
        if invalid is not None:
            status, reason = invalid
            return refuse("rate_limited" if status == 429 else "invalid", status, reason)
        hang = self.draw(knobs.timeout_rate)
        record(ACCEPTED, 200, hang=hang)
        if hang:
            await asyncio.sleep(knobs.hang_s)
        return Answer(200, answer_id)


# the HTTP/2 server ------------------------------------------------------------------------

MAX_BODY_KEPT: Final = MAX_PAYLOAD_BYTES + 1


@dataclass(slots=True)
class _Stream:
    headers: list[tuple[bytes, bytes]]
    body: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    task: asyncio.Task[None] | None = None


class H2Protocol(asyncio.Protocol):
    """One HTTP/2 connection: streams are answered concurrently by :meth:`ApnsEmulator.answer`;
    flow control and stream resets are honoured."""

    def __init__(self, emulator: ApnsEmulator) -> None:
        self.emulator = emulator
        self.conn = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.token = TokenState()
        self._window_open = asyncio.Event()
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            self.transport.close()
            self._closed = True
            return
        self.emulator.connections.add(self)
        self.emulator.connections_opened += 1
        self.conn.local_settings = H2Settings(client=False, initial_values={
            SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
            SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
        })
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(1 << 24)
        self._flush()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            events = self.conn.receive_data(data)
        except H2Error:
            self._flush()
            self.abort()
            return
        for event in events:
            if isinstance(event, RequestReceived) and event.stream_id is not None:
                self.streams[event.stream_id] = _Stream(list(event.headers or ()))
            elif isinstance(event, DataReceived) and event.stream_id is not None:
                self._data(event)
            elif isinstance(event, StreamEnded) and event.stream_id is not None:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.task = asyncio.get_running_loop().create_task(
                        self._serve(event.stream_id, stream))
            elif isinstance(event, StreamReset) and event.stream_id is not None:
                stream = self.streams.pop(event.stream_id, None)
                if stream is not None and stream.task is not None:
                    stream.task.cancel()
            elif isinstance(event, WindowUpdated):
                self._window_open.set()
            elif isinstance(event, ConnectionTerminated):
                self._flush()
                self.abort()
                return
        self._flush()

    def _data(self, event: DataReceived) -> None:
        assert event.stream_id is not None
        stream = self.streams.get(event.stream_id)
        data = event.data or b""
        if stream is not None:
            room = MAX_BODY_KEPT - len(stream.body)
            stream.body += data[:max(room, 0)]
            stream.truncated = stream.truncated or len(data) > room
        with contextlib.suppress(H2Error):
            self.conn.acknowledge_received_data(event.flow_controlled_length or 0,
                                                event.stream_id)

    async def _serve(self, stream_id: int, stream: _Stream) -> None:
        headers: dict[str, str] = {}
        duplicated: set[str] = set()
        for raw_name, raw_value in stream.headers:
            name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
            if name in headers:
                duplicated.add(name)
            headers[name] = value
        request = Request(headers.get(":method", ""), headers.get(":path", ""), headers,
                          frozenset(duplicated), bytes(stream.body), stream.truncated)
        try:
            answer = await self.emulator.answer(self.token, request)
            await self._respond(stream_id, answer)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("apns emulator failed on stream %d", stream_id)
        finally:
            self.streams.pop(stream_id, None)

    async def _respond(self, stream_id: int, answer: Answer) -> None:
        if self._closed or stream_id not in self.streams:
            return
        response = [(b":status", str(answer.status).encode()),
                    (b"apns-id", answer.apns_id.encode())]
        if answer.body:
            response += [(b"content-type", b"application/json"),
                         (b"content-length", str(len(answer.body)).encode())]
        try:
            self.conn.send_headers(stream_id, response, end_stream=not answer.body)
            body = answer.body
            while body:
                window = min(self.conn.local_flow_control_window(stream_id),
                             self.conn.max_outbound_frame_size)
                if window <= 0:
                    self._flush()
                    self._window_open.clear()
                    await self._window_open.wait()
                    if self._closed or stream_id not in self.streams:
                        return
                    continue
                chunk, body = body[:window], body[window:]
                self.conn.send_data(stream_id, chunk, end_stream=not body)
        except H2Error:
            return
        self._flush()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if data and self.transport is not None and not self._closed:
            self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection at once."""
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.emulator.connections.discard(self)
        for stream in self.streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self.streams.clear()
        self._window_open.set()
