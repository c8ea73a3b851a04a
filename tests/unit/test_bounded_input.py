"""What one request can make an API process hold is bounded: bodies are read up to their
route's limit and refused as soon as they pass it, provider webhooks check their headers
before reading a byte, and a request's head is bounded under uvicorn (in process, no
server: httpx's ASGI transport pulls the request body lazily, so the tests count what the
app consumed)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from uvicorn.server import ServerState

from notiflow.gateway.app import build_app, max_any_body
from notiflow.gateway.auth import MAX_BODY_BYTES
from notiflow.gateway.batch import MAX_BATCH_BYTES
from notiflow.gateway.bodies import BodyCeiling, read_limited
from notiflow.gateway.server_limits import BoundedHttpTools, uvicorn_options
from notiflow.providers.sendgrid.routes import MAX_SENDGRID_BODY
from notiflow.providers.sendgrid.signature import EVENT_SIGNATURE_HEADER as SIGNATURE
from notiflow.providers.sendgrid.signature import EVENT_TIMESTAMP_HEADER as TIMESTAMP
from notiflow.providers.ses import sns
from notiflow.providers.ses.dev import SES_TOPIC
from notiflow.settings import ServerLimits, Settings
from tests.helpers import dev_environ, hold_async

CHUNK = 64 * 1024
HUNDRED_MIB = 100 * 1024 * 1024


class Source:
    """A request body of ``total`` bytes in ``CHUNK``-byte pieces that counts what was
    pulled from it."""

    def __init__(self, total: int = HUNDRED_MIB) -> None:
        self.total = total
        self.pulled = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        piece = b"x" * CHUNK
        while self.pulled < self.total:
            self.pulled += CHUNK
            yield piece


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    with dev_environ():
        yield build_app(Settings())


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")


def bearer(app: FastAPI) -> dict[str, str]:
    acme = app.state.runtime.settings.tenant("acme")
    assert acme is not None and acme.token is not None
    return {"Authorization": f"Bearer {acme.token.get_secret_value()}"}


@pytest.mark.parametrize(("path", "limit"), [("/v1/messages", MAX_BODY_BYTES),
                                             ("/v1/messages:batch", MAX_BATCH_BYTES),
                                             ("/v1/templates", MAX_BODY_BYTES)])
async def test_a_chunked_body_is_refused_once_it_passes_the_routes_limit(
        app: FastAPI, path: str, limit: int) -> None:
    body = Source()
    async with client(app) as c:
        r = await c.post(path, content=body, headers=bearer(app))
    assert body.pulled <= limit + CHUNK
    assert r.status_code == 413, r.text
    assert r.json()["reason"] == "body_too_large"
    assert r.headers["connection"] == "close"


async def test_a_declared_length_over_the_limit_is_refused_before_reading(
        app: FastAPI) -> None:
    body = Source(CHUNK)
    headers = {**bearer(app), "Content-Length": str(MAX_BODY_BYTES + 1)}
    async with client(app) as c:
        r = await c.post("/v1/messages", content=body, headers=headers)
    assert r.status_code == 413
    assert body.pulled == 0


async def test_a_route_that_reads_no_body_refuses_one_over_the_ceiling_unread(
        app: FastAPI) -> None:
    body = Source(CHUNK)
    async with client(app) as c:
        r = await c.post("/v1/campaigns/c1/pause", content=body,
                         headers={"Content-Length": str(10 * 1024 ** 3)})
    assert (r.status_code, r.json()["reason"]) == (413, "body_too_large")
    assert body.pulled == 0


async def test_the_ceiling_stops_a_streamed_body_an_app_would_buffer_whole() -> None:
    async def greedy(scope: Any, receive: Any, send: Any) -> None:
        await Response(str(len(await Request(scope, receive).body())))(scope, receive, send)

    limit = 1024 * 1024
    body = Source()
    async with client(BodyCeiling(_with_errors(greedy), limit)) as c:
        r = await c.post("/", content=body)
    assert r.status_code == 413
    assert body.pulled <= limit + CHUNK
    assert max_any_body(Settings()) == MAX_BATCH_BYTES


def _with_errors(inner: Any) -> FastAPI:
    from notiflow.gateway import errors
    outer = FastAPI()
    errors.install(outer)
    outer.mount("/", inner)
    return outer


TRICKLE_GAP_S = 0.05
"""A slow client's pause between bytes: four of them outlast the 0.2 s body timeout."""


async def test_a_body_that_arrives_too_slowly_is_refused_408() -> None:
    async def trickle() -> AsyncIterator[bytes]:
        while True:
            yield b"{"
            await hold_async(TRICKLE_GAP_S)

    async def route(scope: Any, receive: Any, send: Any) -> None:
        body = await read_limited(Request(scope, receive), 1024, timeout_s=0.2)
        await Response(str(len(body)))(scope, receive, send)

    async with client(_with_errors(route)) as c:
        r = await c.post("/", content=trickle())
    assert (r.status_code, r.json()["reason"]) == (408, "body_too_slow")


async def test_sendgrid_without_its_signature_headers_is_refused_before_its_body(
        app: FastAPI) -> None:
    now = str(int(time.time()))
    good_sig = "A" * 96
    cases = [({}, "missing_signature"),
             ({TIMESTAMP: now}, "missing_signature"),
             ({SIGNATURE: good_sig,
               TIMESTAMP: "1"}, "stale_timestamp"),
             ({SIGNATURE: "not base64 at all!" * 3,
               TIMESTAMP: now}, "invalid_signature")]
    async with client(app) as c:
        for headers, reason in cases:
            body = Source()
            r = await c.post("/webhooks/sendgrid", content=body, headers=headers)
            assert (r.status_code, r.json()["reason"]) == (403, reason), headers
            assert body.pulled == 0, headers


async def test_a_signed_looking_sendgrid_post_is_read_only_up_to_one_mib(
        app: FastAPI) -> None:
    body = Source()
    headers = {SIGNATURE: "A" * 96,
               TIMESTAMP: str(int(time.time()))}
    async with client(app) as c:
        r = await c.post("/webhooks/sendgrid", content=body, headers=headers)
    assert r.status_code == 413
    assert MAX_SENDGRID_BODY == 1024 * 1024
    assert body.pulled <= MAX_SENDGRID_BODY + CHUNK


async def test_twilio_and_ses_posts_are_refused_on_their_headers_before_their_body(
        app: FastAPI) -> None:
    async with client(app) as c:
        for path, headers, status, reason in [
                ("/webhooks/twilio", {}, 403, "invalid_signature"),
                ("/webhooks/twilio", {"X-Twilio-Signature": "short"}, 403,
                 "invalid_signature"),
                ("/webhooks/ses", {"x-amz-sns-topic-arn": "arn:aws:sns:eu-west-1:1:other"},
                 403, "wrong_account"),
                ("/webhooks/ses", {"x-amz-sns-message-type": "Exploit"}, 403, "not_sns")]:
            body = Source()
            r = await c.post(path, content=body, headers=headers)
            assert (r.status_code, r.json()["reason"]) == (status, reason), (path, headers)
            assert body.pulled == 0


def test_the_sns_header_check_lets_a_configured_topic_through() -> None:
    settings = Settings(ses={"sns_topic_arns": (SES_TOPIC,)})
    assert sns.check_headers(settings.ses.sns_topic_arns, {
        "x-amz-sns-topic-arn": SES_TOPIC, "x-amz-sns-message-type": "Notification"}) is None


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 18080)}.get(
            name, default)


def _protocol(limits: ServerLimits) -> tuple[BoundedHttpTools, Transport]:
    async def noop(scope: Any, receive: Any, send: Any) -> None:
        return None

    options = uvicorn_options(limits)
    config = uvicorn.Config(noop, **options)
    config.load()
    proto = options["http"](config=config, server_state=ServerState(), app_state={},
                            _loop=asyncio.get_running_loop())
    transport = Transport()
    proto.connection_made(transport)
    return proto, transport


async def test_an_endless_request_head_is_cut_off_with_431() -> None:
    proto, transport = _protocol(ServerLimits(max_head_bytes=16 * 1024))
    proto.data_received(b"GET / HTTP/1.1\r\nHost: api\r\nX-Pad: ")
    for _ in range(64):
        if transport.closed:
            break
        proto.data_received(b"a" * 4096)
    assert transport.closed
    assert transport.written.startswith(b"HTTP/1.1 431 ")
    assert proto.head_bytes <= 16 * 1024 + 4096


def test_uvicorn_runs_with_the_settings_limits() -> None:
    limits = Settings().api_server
    options = uvicorn_options(limits)
    assert options["limit_concurrency"] == limits.max_concurrency == 1000
    assert options["backlog"] == limits.backlog
    assert options["timeout_keep_alive"] == 5
    assert options["h11_max_incomplete_event_size"] == limits.max_head_bytes
    tuned = Settings(api_server={"max_concurrency": 10, "backlog": 64}).api_server
    assert uvicorn_options(tuned)["limit_concurrency"] == 10
