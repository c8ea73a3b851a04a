"""Access lines and server spans of the API name the route template, never the request's
path or query string: a URL-encoded phone number (``%2B4179…``), e-mail address (``%40``) or
device token in a path leaves no trace in logs or span attributes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from notiflow import telemetry
from notiflow.gateway import app as gateway_app
from notiflow.gateway.access_log import UNMATCHED, route_template
from notiflow.settings import Settings
from tests.helpers import dev_environ

PHONE = "+41791234567"
EMAIL = "j.doe@example.com"
TOKEN = "f00dfeedcafe0123456789abcdef"
SECRETS = ("41791234567", "%2B4179", "j.doe", "%40", "example.com", TOKEN)
REQUESTS = (
    ("GET", "/v1/recipients/%2B41791234567/preferences?since=%2B41791234567",
     "/v1/recipients/{recipient}/preferences"),
    ("GET", f"/v1/recipients/j.doe%40example.com/devices/{TOKEN}",
     "/v1/recipients/{recipient}/devices/{token}"),
    ("DELETE", f"/v1/recipients/%2B41791234567/devices/{TOKEN}",
     "/v1/recipients/{recipient}/devices/{token}"),
    ("GET", "/webhooks/vonage?msisdn=41791234567&to=j.doe%40example.com", "/webhooks/vonage"),
    ("GET", f"/no/such/route/%2B41791234567/{TOKEN}", UNMATCHED),
    ("PATCH", "/v1/recipients/%2B41791234567/preferences",
     "/v1/recipients/{recipient}/preferences"),
)


@pytest.fixture(scope="module")
def settings() -> Iterator[Settings]:
    with dev_environ():
        yield Settings()


def _call(app: FastAPI) -> None:
    client = TestClient(app, raise_server_exceptions=False)
    for method, path, _ in REQUESTS:
        client.request(method, path, headers={"Authorization": "Bearer not-a-tenant"})


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s.lower() in text.lower()]


def test_access_lines_name_the_route_never_the_path(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    _call(gateway_app.build_app(settings))
    lines = [r for r in caplog.records if r.name == "notiflow.access"]
    assert [r.http_route for r in lines] == [template for _, _, template in REQUESTS]  # type: ignore[attr-defined]
    assert '"GET /v1/recipients/{recipient}/devices/{token} HTTP/1.1" 401' in lines[1].getMessage()
    for formatter in (telemetry.JsonFormatter(), telemetry.TextFormatter()):
        for r in caplog.records:
            if r.name == "httpx":
                continue  # the test's own client
            assert _leaks(formatter.format(r)) == [], formatter.format(r)


def test_uvicorns_own_access_log_is_off(settings: Settings,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's access line holds the path re-quoted (``%2B``, ``%40``), past ``scrub``."""
    configs: list[uvicorn.Config] = []

    class Server:
        def __init__(self, config: uvicorn.Config) -> None:
            configs.append(config)

        def run(self) -> None:
            return None

    monkeypatch.setattr(gateway_app.uvicorn, "Server", Server)
    gateway_app.run_server(FastAPI(), settings,
                           {"version": 1, "disable_existing_loggers": False})
    assert configs and configs[0].access_log is False


def test_a_uvicorn_access_line_that_slips_through_shows_no_path() -> None:
    rec = logging.makeLogRecord({
        "name": "uvicorn.access", "msg": '%s - "%s %s HTTP/%s" %d',
        "args": ("127.0.0.1:5", "GET",
                 f"/v1/recipients/%2B41791234567/devices/{TOKEN}?to=j.doe%40example.com",
                 "1.1", 200)})
    telemetry.TraceContextFilter().filter(rec)
    assert rec.getMessage() == f'127.0.0.1:5 - "GET {telemetry.HIDDEN_PATH} HTTP/1.1" 200'


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "_state", telemetry.Telemetry(tracer_provider=provider))
    monkeypatch.setattr(RedisInstrumentor, "instrument", lambda self, **kw: None)
    return exporter


def test_server_spans_carry_the_route_never_the_path(
        settings: Settings, spans: InMemorySpanExporter) -> None:
    _call(gateway_app.build_app(settings))
    finished = spans.get_finished_spans()
    assert len(finished) == len(REQUESTS)
    for sp, (method, _, template) in zip(finished, REQUESTS, strict=True):
        attrs: dict[str, Any] = dict(sp.attributes or {})
        assert _leaks(sp.name) == [] and _leaks(repr(attrs)) == [], (sp.name, attrs)
        target = attrs.get("http.target", attrs.get("url.path"))
        assert target == template
        if template != UNMATCHED:
            assert sp.name == f"{method} {template}"


def test_route_template_never_falls_back_to_the_path() -> None:
    scope = {"type": "http", "method": "GET", "path": f"/x/{PHONE}", "root_path": ""}
    assert route_template(scope) == UNMATCHED
    assert route_template({**scope, "app": FastAPI()}) == UNMATCHED
    assert PHONE not in route_template({**scope, "route": object()})
