"""Fixtures of the Messaging API tests: a client of the session's ``notiflow api``, tenant
headers, the ``otp`` template and the message store."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.settings import Settings
from tests.integration.api.support import (
    TEMPLATE,
)


@pytest.fixture(scope="session")
def fakes(stack: Settings) -> str:
    """The Messaging API never calls a provider: these tests need no emulators."""
    return f"http://127.0.0.1:{stack.fakes_port}"


@pytest.fixture(scope="module")
def client(api: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def auth(tokens: dict[str, str]) -> Callable[..., dict[str, str]]:
    def make(tenant: str, key: str | None = None, **extra: str) -> dict[str, str]:
        h = {"Authorization": f"Bearer {tokens[tenant]}", **extra}
        if key is not None:
            h["Idempotency-Key"] = key
        return h

    return make


@pytest.fixture(scope="module")
def otp_template(client: httpx.Client, auth: Callable[..., dict[str, str]]) -> str:
    """Version 1 of an SMS template with one variable, for every test tenant."""
    for tenant in ("acme", "globex", "mkt"):
        r = client.post("/v1/templates", headers=auth(tenant), json={
            "template_id": TEMPLATE, "version": 1, "channel": "SMS",
            "body": "Your code is {{ code }}",
        })
        assert r.status_code in (200, 201), r.text
    return TEMPLATE


@pytest.fixture(scope="session")
def store(stack: Settings) -> Iterator[CassandraStore]:
    cluster, session = connect(stack)
    yield CassandraStore(session, stack)
    cluster.shutdown()
