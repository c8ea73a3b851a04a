"""``POST /v1/messages`` is served directly (``gateway/direct.py``): ahead of FastAPI's route,
authenticating and reading the same headers, while the document still states FastAPI's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Match, Route

from notiflow.gateway import messages
from notiflow.gateway.app import build_app
from notiflow.gateway.auth import authenticate, get_runtime
from notiflow.settings import Settings
from tests.helpers import dev_environ


@pytest.fixture(scope="module")
def app() -> Iterator[FastAPI]:
    with dev_environ():
        yield build_app(Settings())


def _served_directly(app: FastAPI, method: str, path: str) -> bool:
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return (isinstance(route, Route)
                    and route.endpoint is messages.send_message_directly)
    raise AssertionError(f"no route serves {method} {path}")


def _api_routes(app: FastAPI) -> Iterator[APIRoute]:
    for route in app.router.routes:
        included = getattr(route, "original_router", None)
        for r in (included.routes if included is not None else [route]):
            if isinstance(r, APIRoute):
                yield r


def test_post_is_served_by_the_direct_route_and_nothing_else_moves(app: FastAPI) -> None:
    assert _served_directly(app, "POST", "/v1/messages")
    assert not _served_directly(app, "GET", "/v1/messages")
    assert not _served_directly(app, "POST", "/v1/messages:batch")
    assert not _served_directly(app, "GET", "/v1/messages/m1")


def test_the_documented_route_declares_exactly_what_the_direct_one_honours(
        app: FastAPI) -> None:
    """A parameter or dependency added to ``send_message`` must be honoured by
    ``send_message_directly`` too: this test names what it honours today."""
    documented = next(r for r in _api_routes(app)
                      if r.path == "/v1/messages" and "POST" in (r.methods or ()))
    dependant = documented.dependant
    assert [p.alias for p in dependant.header_params] == ["Idempotency-Key", "traceparent"]
    assert [d.call for d in dependant.dependencies] == [authenticate, get_runtime]
    assert not dependant.query_params and not dependant.body_params
    op = app.openapi()["paths"]["/v1/messages"]["post"]
    assert op["security"] == [{"TenantToken": []}]
    assert {p["name"] for p in op["parameters"]} == {"Idempotency-Key", "traceparent"}


def test_the_direct_route_authenticates_and_checks_the_key(app: FastAPI) -> None:
    client = TestClient(app, raise_server_exceptions=False)
    body = {"channel": "SMS", "tier": "P1", "recipient": {"phone": "+14155550123"},
            "template_id": "otp", "variables": {"code": "1"}}
    missing = client.post("/v1/messages", json=body)
    assert missing.status_code == 401
    assert missing.json()["reason"] == "missing_token"
    assert missing.headers["WWW-Authenticate"] == "Bearer"
    unknown = client.post("/v1/messages", json=body, headers={"Authorization": "Bearer nope"})
    assert unknown.json()["reason"] == "unknown_token"
    acme = app.state.runtime.settings.tenant("acme")
    assert acme is not None and acme.token is not None
    token = acme.token.get_secret_value()
    bad_key = client.post("/v1/messages", json=body, headers={
        "Authorization": f"Bearer {token}", "Idempotency-Key": "has space"})
    assert bad_key.status_code == 400
    assert bad_key.json()["reason"] == "invalid_idempotency_key"
