"""The inbox's connection caps and connect rate (``inbox/limits.py``) on a clock the tests
drive, and the server refusing before the upgrade (a mocked request, no server)."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from notiflow.inbox.limits import Gate, Refusal
from notiflow.inbox.server import InboxServer
from notiflow.inbox.tokens import mint
from notiflow.providers.inbox.config import InboxSettings
from notiflow.settings import Settings, TenantConfig
from notiflow.token_bucket import TokenBucket
from tests.fakes import ManualClock

KEY = "k" * 43


def rules(**kw: Any) -> InboxSettings:
    base: dict[str, Any] = {"max_connections": 100, "max_connections_per_tenant": 100,
                            "connect_rate": 2.0, "connect_burst": 3}
    return InboxSettings(**{**base, **kw})


def test_the_bucket_gives_its_burst_then_its_rate() -> None:
    bucket = TokenBucket.full(rate=2.0, burst=3, now=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) == 0.0
    assert bucket.take(100.0) == 0.0
    assert bucket.tokens == pytest.approx(2.0)


def test_one_tenant_at_its_cap_leaves_room_for_another() -> None:
    gate = Gate(rules(max_connections_per_tenant=2, connect_burst=100), ManualClock(1000.0))
    assert gate.admit("a") is None and gate.admit("a") is None
    assert gate.admit("a") == Refusal(429, "tenant_connections", 5)
    assert gate.admit("b") is None
    gate.release("a")
    assert gate.admit("a") is None
    assert (gate.live, gate.by_tenant) == (3, {"a": 2, "b": 1})


def test_the_process_cap_refuses_everyone_with_503() -> None:
    gate = Gate(rules(max_connections=3, connect_burst=100), ManualClock(1000.0))
    for tenant in ("a", "b", "c"):
        assert gate.admit(tenant) is None
    assert gate.admit("d") == Refusal(503, "server_full", 5)
    gate.release("b")
    assert gate.admit("d") is None


def test_a_reconnect_storm_is_paced_per_tenant_and_a_refusal_takes_no_token() -> None:
    clock = ManualClock(1000.0)
    gate = Gate(rules(connect_rate=2.0, connect_burst=3), clock)
    for _ in range(3):
        assert gate.admit("a") is None
        gate.release("a")
    refused = gate.admit("a")
    assert refused is not None and (refused.status, refused.reason) == (429, "connect_rate")
    assert refused.retry_after_s == 1
    assert gate.admit("b") is None
    clock.now += 0.5
    assert gate.admit("a") is None
    assert gate.admit("a") is not None
    assert gate.live == 2


def test_a_release_without_an_admit_changes_nothing() -> None:
    gate = Gate(rules(), ManualClock(1000.0))
    gate.release("a")
    assert (gate.live, gate.by_tenant) == (0, {})


def server(**inbox: Any) -> tuple[InboxServer, Settings]:
    settings = Settings(tenants=(TenantConfig(id="acme", inbox_keys=(KEY,)),
                                 TenantConfig(id="globex", inbox_keys=(KEY[::-1],))),
                        inbox=rules(**inbox))
    none: Any = None
    return InboxServer(settings, none, none, None), settings


@pytest.mark.parametrize("path", ["/v1/inbox/ws", "/v1/inbox/events"])
async def test_a_tenant_over_its_cap_is_refused_429_before_the_upgrade(path: str) -> None:
    srv, _ = server(max_connections_per_tenant=1)
    assert srv.gate.admit("acme") is None
    request = make_mocked_request("GET", f"{path}?access_token={mint(KEY, 'acme', 'u-1')}",
                                  headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                           "Sec-WebSocket-Version": "13",
                                           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    handler = srv.websocket if path.endswith("ws") else srv.events
    with pytest.raises(web.HTTPTooManyRequests) as refused:
        await handler(request)
    assert refused.value.headers["Retry-After"] == "5"
    assert "tenant_connections" in (refused.value.text or "")
    assert srv.gate.by_tenant == {"acme": 1}


async def test_a_full_process_is_refused_503_and_a_connection_gives_its_place_back() -> None:
    srv, _ = server(max_connections=1)
    user = srv.user(make_mocked_request(
        "GET", f"/v1/inbox/events?access_token={mint(KEY[::-1], 'globex', 'u-2')}"))
    with srv.admitted(user):
        assert srv.gate.live == 1
        request = make_mocked_request(
            "GET", f"/v1/inbox/events?access_token={mint(KEY, 'acme', 'u-1')}")
        with pytest.raises(web.HTTPServiceUnavailable):
            await srv.events(request)
    assert srv.gate.live == 0
    with pytest.raises(RuntimeError), srv.admitted(user):
        raise RuntimeError("the upgrade failed")
    assert (srv.gate.live, srv.gate.by_tenant) == (0, {})
