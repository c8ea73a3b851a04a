"""Egress to tenant URLs: the address and URL rules (properties over every IPv4/IPv6 form),
the guard's lookups (a stub resolver; no real DNS), pinning (the connection goes to the
vetted loopback address while Host, SNI and certificate verification keep the URL's name),
the senders (a refused URL never connects, never reaches a breaker) and the API's 422.

Every test here connects to loopback only: a guard on ``socket.connect`` fails any test that
tries another address, and records every attempt."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import ssl
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from notiflow.adapters.campaign_notices import Notice
from notiflow.adapters.client_webhooks import Verdict, WebhookClient
from notiflow.adapters.egress import (
    Denied,
    EgressGuard,
    NotVetted,
    PinnedResolver,
    StaticResolver,
    Vetted,
    pinned,
    pinned_connector,
)
from notiflow.devenv import webhook_secret
from notiflow.egress import (
    METADATA_ADDRESSES,
    IPAddress,
    Refusal,
    Target,
    address_class,
    check_address,
    check_url,
    embedded_ipv4,
)
from notiflow.flows.campaigns.state_notices import Notifier
from notiflow.flows.webhooks.webhook_sender import Request, WebhookDispatcher
from notiflow.gateway.app import build_app
from notiflow.settings import EgressSettings, Settings, TenantConfig
from tests.helpers import dev_environ

LOOPBACK = EgressSettings(allow_http=True, allow_networks=(IPv4Network("127.0.0.0/8"),
                                                           IPv6Network("::1/128")))
EVERYTHING = EgressSettings(allow_http=True, allow_networks=(IPv4Network("0.0.0.0/0"),
                                                             IPv6Network("::/0")),
                            allow_hosts=("metadata.google.internal", "evil.test"))
STRICT = EgressSettings()
SECRET = webhook_secret()


@pytest.fixture(autouse=True)
def connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every connect of this test, refused unless to loopback."""
    made: list[Any] = []
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def check(address: Any) -> None:
        made.append(address)
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and not ip_address(host.split("%")[0]).is_loopback:
            raise AssertionError(f"a test tried to connect to {host}")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    yield made


# the address rule ---------------------------------------------------------------------------

REFUSED_V4 = ["0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
              "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16",
              "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4",
              "240.0.0.0/4"]
REFUSED_V6 = ["::1/128", "::/128", "fc00::/7", "fe80::/10", "ff00::/8", "2001:db8::/32",
              "2001::/32", "64:ff9b:1::/48", "100::/64"]
PUBLIC_V4 = ["8.0.0.0/8", "1.1.1.0/24", "93.184.0.0/16", "151.101.0.0/16"]
PUBLIC_V6 = ["2a00::/12", "2600::/12", "2400::/12"]


def v6_forms(v4: IPv4Address, low: int) -> dict[str, IPv6Address]:
    """``v4`` embedded in each IPv6 form that carries an IPv4 address."""
    n = int(v4)
    return {"mapped": IPv6Address((0xFFFF << 32) | n),
            "compatible": IPv6Address(n),
            "siit": IPv6Address((0xFFFF << 48) | n),
            "nat64": IPv6Address(int(IPv6Address("64:ff9b::")) | n),
            "6to4": IPv6Address((0x2002 << 112) | (n << 80) | (low & (2**80 - 1)))}


refused_v4 = st.sampled_from(REFUSED_V4).flatmap(lambda n: st.ip_addresses(network=n))
public_v4 = st.sampled_from(PUBLIC_V4).flatmap(lambda n: st.ip_addresses(network=n))


@given(refused_v4, st.integers(0, 2**80 - 1))
def test_every_form_of_a_refused_ipv4_address_is_refused(ip: IPv4Address, low: int) -> None:
    assert address_class(ip) is not None
    assert check_address(ip, STRICT) is not None
    for form, v6 in v6_forms(ip, low).items():
        if form == "compatible" and int(ip) <= 1:
            continue
        assert check_address(v6, STRICT) is not None, (form, v6)


@given(public_v4, st.integers(0, 2**80 - 1))
def test_public_ipv4_passes_alone_mapped_nat64_and_6to4(ip: IPv4Address, low: int) -> None:
    forms = v6_forms(ip, low)
    assert check_address(ip, STRICT) is None
    for form in ("mapped", "nat64", "6to4"):
        assert check_address(forms[form], STRICT) is None, form
        assert embedded_ipv4(forms[form]) == ip
    for form in ("compatible", "siit"):
        assert address_class(forms[form]) == "reserved", form


@given(st.sampled_from(REFUSED_V6).flatmap(lambda n: st.ip_addresses(v=6, network=n)))
def test_refused_ipv6_ranges(ip: IPv6Address) -> None:
    assert check_address(ip, STRICT) is not None


@given(st.sampled_from(PUBLIC_V6).flatmap(lambda n: st.ip_addresses(v=6, network=n)))
def test_public_ipv6_passes(ip: IPv6Address) -> None:
    assert check_address(ip, STRICT) is None


@given(st.sampled_from(sorted(METADATA_ADDRESSES, key=str)), st.integers(0, 2**80 - 1))
def test_metadata_addresses_are_refused_in_every_form_whatever_is_allowed(
        ip: IPAddress, low: int) -> None:
    forms: list[IPAddress] = [ip]
    if isinstance(ip, IPv4Address):
        forms += v6_forms(ip, low).values()
    else:
        forms.append(IPv6Address(f"{ip}%eth0"))
    for form in forms:
        refusal = check_address(form, EVERYTHING, "metadata.google.internal")
        assert refusal is not None and refusal.kind == "metadata", form


@pytest.mark.parametrize(("ip", "kind"), [
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"),
    ("100.100.100.200", "metadata"), ("168.63.129.16", "metadata"),
    ("127.0.0.1", "loopback"), ("10.1.2.3", "private"), ("100.64.0.1", "cgnat"),
    ("169.254.1.1", "link_local"), ("fe80::1", "link_local"), ("fd12::1", "ula"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"),
    ("::", "unspecified"), ("198.18.0.1", "benchmark"), ("255.255.255.255", "reserved"),
    ("::ffff:10.0.0.1", "private"), ("64:ff9b::7f00:1", "loopback"),
    ("2002:a9fe:a9fe::1", "metadata"), ("8.8.8.8", None), ("2606:4700::1111", None)])
def test_address_classes(ip: str, kind: str | None) -> None:
    assert address_class(ip_address(ip)) == kind


def test_allow_networks_and_hosts_let_chosen_addresses_through_and_nothing_else() -> None:
    assert check_address(ip_address("127.0.0.1"), LOOPBACK) is None
    assert check_address(ip_address("::ffff:127.0.0.1"), LOOPBACK) is None
    assert check_address(ip_address("::1"), LOOPBACK) is None
    assert check_address(ip_address("10.0.0.1"), LOOPBACK) is not None
    by_name = EgressSettings(allow_hosts=("Receiver.Internal.",))
    assert by_name.allow_hosts == ("receiver.internal",)
    assert check_address(ip_address("10.0.0.1"), by_name, "receiver.internal") is None
    assert check_address(ip_address("10.0.0.1"), by_name, "other.internal") is not None


# the URL rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "kind"), [
    ("http://169.254.169.254/latest/meta-data", "scheme"),
    ("http://hooks.example.com/x", "scheme"),
    ("ftp://hooks.example.com/x", "scheme"),
    ("/relative/path", "scheme"),
    ("https://169.254.169.254/latest/meta-data", "metadata"),
    ("https://[::ffff:a9fe:a9fe]/", "metadata"),
    ("https://[fd00:ec2::254]/", "metadata"),
    ("https://[fe80::1%25eth0]/", "link_local"),
    ("https://127.0.0.1:8443/", "loopback"),
    ("https://[::1]/", "loopback"),
    ("https://10.0.0.7/hook", "private"),
    ("https://100.64.0.1/", "cgnat"),
    ("https://2130706433/", "host"),
    ("https://0x7f.1/", "host"),
    ("https://127.1/", "host"),
    ("https://017700000001/", "host"),
    ("https://example.123/", "host"),
    ("https://metadata.google.internal/computeMetadata/v1/", "metadata"),
    ("https://METADATA.google.internal./", "metadata"),
    ("https://hooks.example.com:0/", "host"),
])
def test_urls_refused_before_any_lookup(url: str, kind: str) -> None:
    refusal = check_url(url, STRICT)
    assert isinstance(refusal, Refusal) and refusal.kind == kind, refusal


def test_http_is_allowed_only_when_configured_and_names_are_left_to_resolve() -> None:
    dev = EgressSettings(allow_http=True)
    assert check_url("http://hooks.example.com:8080/x", dev) == Target(
        "http", "hooks.example.com", 8080)
    assert check_url("https://Bücher.example/x", STRICT) == Target(
        "https", "xn--bcher-kva.example", 443)
    assert check_url("https://8.8.8.8/x", STRICT) == Target(
        "https", "8.8.8.8", 443, IPv4Address("8.8.8.8"))
    assert isinstance(check_url("http://169.254.169.254/", dev), Refusal)


def test_the_defaults_refuse_what_the_dev_environment_allows() -> None:
    assert Settings().egress == STRICT
    with dev_environ():
        dev = Settings().egress
    assert dev.allow_http and check_address(ip_address("127.0.0.1"), dev) is None
    assert check_address(ip_address("10.0.0.1"), dev) is not None
    assert isinstance(check_url("http://127.0.0.1:9/hook", STRICT), Refusal)
    assert isinstance(check_url("http://127.0.0.1:9/hook", dev), Target)


# the guard -----------------------------------------------------------------------------------


class Counting(StaticResolver):
    """Answers each name with its next answer (a rebinding DNS server)."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        super().__init__({})
        self.answers = answers

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        self.asked.append(host)
        return tuple(ip_address(a) for a in self.answers[host].pop(0))


class Slow(StaticResolver):
    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        await asyncio.Event().wait()
        raise AssertionError("not reached")


async def test_names_resolving_to_refused_addresses_are_denied_without_naming_them() -> None:
    table = {"inside.test": ["10.9.8.7"], "mixed.test": ["8.8.8.8", "127.0.0.1"],
             "meta.test": ["169.254.169.254"], "public.test": ["8.8.8.8", "2606:4700::1"],
             "home.test": ["127.0.0.1"]}
    strict = EgressGuard(STRICT, StaticResolver(table))
    for host in ("inside.test", "mixed.test", "meta.test", "home.test"):
        verdict = await strict.vet(f"https://{host}/hook")
        assert isinstance(verdict, Denied) and verdict.reason == "not_allowed", host
        assert not any(a in verdict.detail for a in ("10.9", "127.", "169.254"))
    ok = await strict.vet("https://public.test/hook")
    assert isinstance(ok, Vetted) and ok.url == "https://public.test/hook"
    assert ok.addresses == (IPv4Address("8.8.8.8"), IPv6Address("2606:4700::1"))
    missing = await strict.vet("https://nowhere.test/hook")
    assert isinstance(missing, Denied) and missing.reason == "unresolvable"
    dev = await EgressGuard(LOOPBACK, StaticResolver(table)).vet("http://home.test:81/")
    assert isinstance(dev, Vetted) and dev.port == 81


async def test_literals_are_never_looked_up_and_verdicts_are_cached() -> None:
    now = [0.0]
    resolver = StaticResolver({"public.test": ["8.8.8.8"]})
    guard = EgressGuard(STRICT, resolver, clock=lambda: now[0])
    assert isinstance(await guard.vet("https://169.254.169.254/"), Denied)
    assert isinstance(await guard.vet("https://8.8.4.4/"), Vetted)
    assert resolver.asked == []
    for _ in range(3):
        assert isinstance(await guard.vet("https://public.test/a"), Vetted)
    assert resolver.asked == ["public.test"]
    now[0] = 31.0
    await guard.vet("https://public.test/b")
    assert resolver.asked == ["public.test", "public.test"]


async def test_a_lookup_that_does_not_answer_in_time_is_unresolvable() -> None:
    rule = EgressSettings(resolve_timeout=timedelta(milliseconds=50))
    started = asyncio.get_running_loop().time()
    verdict = await EgressGuard(rule, Slow({})).vet("https://slow.test/")
    assert isinstance(verdict, Denied) and verdict.reason == "unresolvable"
    assert asyncio.get_running_loop().time() - started < 5


async def test_the_pinned_resolver_answers_only_the_vetted_host() -> None:
    resolver = PinnedResolver()
    with pytest.raises(NotVetted):
        await resolver.resolve("hook.test", 443)
    vetted = Vetted("https://hook.test/", "hook.test", 443, (IPv4Address("127.0.0.1"),))
    with pinned(vetted):
        [hit] = await resolver.resolve("hook.test", 443)
        assert (hit["host"], hit["hostname"], hit["port"]) == ("127.0.0.1", "hook.test", 443)
        with pytest.raises(NotVetted):
            await resolver.resolve("other.test", 443)
    with pytest.raises(NotVetted):
        await resolver.resolve("hook.test", 443)


# the senders ---------------------------------------------------------------------------------


class Server:
    """A loopback HTTP(S) receiver that records Host headers (and SNI names)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.hosts: list[str] = []
        self.sni: list[str | None] = []
        self.ssl_context = ssl_context
        if ssl_context is not None:
            ssl_context.sni_callback = lambda _s, name, _c: self.sni.append(name)
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Server:
        async def hook(request: web.Request) -> web.Response:
            self.hosts.append(request.headers["Host"])
            return web.Response(status=204)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def test_a_post_goes_to_the_vetted_address_with_the_urls_host(
        connections: list[Any]) -> None:
    """``hook.test`` does not exist in DNS: only the stub's answer, pinned, reaches the
    receiver; a rebinding second answer is never asked for."""
    async with Server() as rx:
        resolver = Counting({"hook.test": [["127.0.0.1"], ["169.254.169.254"]]})
        client = WebhookClient(timedelta(seconds=5), egress=EgressGuard(LOOPBACK, resolver))
        try:
            url = f"http://hook.test:{rx.port}/hook"
            result = await client.post(url, "wh_1", b"{}", [SECRET])
        finally:
            await client.aclose()
    assert result.verdict is Verdict.DELIVERED, result
    assert rx.hosts == [f"hook.test:{rx.port}"] and resolver.asked == ["hook.test"]
    assert [a[0] for a in connections] == ["127.0.0.1"]


async def test_tls_keeps_the_urls_name_for_sni_and_verification() -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hook.test").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    async with Server(server_ctx) as rx, aiohttp.ClientSession(
            connector=pinned_connector(4)) as session:
        loopback = (IPv4Address("127.0.0.1"),)
        good = Vetted(f"https://hook.test:{rx.port}/", "hook.test", rx.port, loopback)
        with pinned(good):
            async with session.get(good.url, ssl=client_ctx) as resp:
                assert resp.status == 204
        wrong = Vetted(f"https://else.test:{rx.port}/", "else.test", rx.port, loopback)
        with pinned(wrong), pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(wrong.url, ssl=client_ctx)
    assert rx.sni[0] == "hook.test" and rx.hosts == [f"hook.test:{rx.port}"]


@pytest.mark.parametrize("url", [
    "https://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[::ffff:169.254.169.254]/", "https://10.0.0.1/", "https://meta.test/",
    "https://inside.test/"])
async def test_a_refused_url_is_never_connected_to(url: str, connections: list[Any]) -> None:
    resolver = StaticResolver({"meta.test": ["169.254.169.254"], "inside.test": ["10.0.0.2"]})
    client = WebhookClient(timedelta(seconds=5), egress=EgressGuard(STRICT, resolver))
    try:
        result = await client.post(url, "wh_1", b"{}", [SECRET])
    finally:
        await client.aclose()
    assert result.verdict is Verdict.REFUSED and result.reason.startswith("url_not_allowed:")
    assert connections == []


async def test_an_unresolvable_host_is_a_failed_attempt_not_a_refusal() -> None:
    client = WebhookClient(timedelta(seconds=5),
                           egress=EgressGuard(STRICT, StaticResolver({})))
    result = await client.post("https://gone.test/", "wh_1", b"{}", [SECRET])
    await client.aclose()
    assert (result.verdict, result.reason) == (Verdict.RETRY, "dns_error")


class Breakers:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def allow(self, key: str) -> Any:
        self.calls.append(key)
        raise AssertionError("a refused URL reached the breaker")

    async def record(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("record")

    async def aclose(self) -> None:
        return None


def test_the_dispatcher_refuses_before_the_breaker_and_the_network(
        connections: list[Any]) -> None:
    breakers = Breakers()
    dispatcher = WebhookDispatcher(Settings(), lambda: breakers)
    try:
        dispatcher.ready()
        fut = dispatcher.submit(Request("https://169.254.169.254:443",
                                        "https://169.254.169.254/latest/meta-data", "wh_1",
                                        b"{}", (SecretStr(SECRET),), tenant_id="acme"))
        result = fut.result(timeout=10)
    finally:
        dispatcher.close()
    assert not isinstance(result, concurrent.futures.Future)
    assert getattr(result, "verdict", None) is Verdict.REFUSED
    assert breakers.calls == [] and connections == []


class Board:
    def __init__(self, n: Notice) -> None:
        self.notices = {n.webhook_id: n}
        self.log: list[tuple[str, int, str]] = []

    async def add(self, n: Notice) -> None:
        self.notices[n.webhook_id] = n

    async def due(self, now: datetime) -> list[Notice]:
        return list(self.notices.values())

    async def claim(self, n: Notice, until: datetime) -> bool:
        return True

    async def retry(self, n: Notice, attempt: int, at: datetime, error: str) -> None:
        self.log.append(("retry", attempt, error))

    async def give_up(self, n: Notice, attempt: int, at: datetime, error: str) -> None:
        self.log.append(("gave_up", attempt, error))
        self.notices.pop(n.webhook_id)

    async def done(self, n: Notice) -> None:
        self.log.append(("done", n.attempt, ""))


async def test_a_campaign_notice_to_a_refused_url_is_given_up_without_a_connection(
        connections: list[Any]) -> None:
    now = datetime(2026, 12, 6, tzinfo=UTC)
    tenant = TenantConfig(id="mkt", token=SecretStr("t" * 32),
                          webhook_secrets=(SecretStr(SECRET),))
    settings = Settings().model_copy(update={"tenants": (tenant,)})
    notice = Notice("cmp_x_running_1", "cmp_x", "mkt",
                    "http://169.254.169.254/latest/meta-data", b"{}", 0, now)
    board = Board(notice)
    client = WebhookClient(timedelta(seconds=5), egress=EgressGuard(
        EgressSettings(allow_http=True), StaticResolver({})))
    try:
        assert await Notifier(settings, board, client.post, clock=lambda: now).tick() == 1
    finally:
        await client.aclose()
    assert board.log == [("gave_up", 1, "url_not_allowed:metadata")]
    assert connections == []


# acceptance ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[FastAPI, dict[str, str]]]:
    with dev_environ() as tokens:
        app = build_app(Settings())
    app.state.runtime.egress = EgressGuard(app.state.runtime.settings.egress, StaticResolver(
        {"inside.test": ["10.0.0.9"], "meta.test": ["169.254.169.254"]}))
    yield app, tokens


SMS = {"channel": "SMS", "tier": "P1", "recipient": "+14155550123", "template_id": "otp",
       "template_version": 1, "variables": {"code": "1"}}
REFUSED_HOOKS = ["http://169.254.169.254/latest/meta-data", "https://[fd00:ec2::254]/",
                 "http://10.0.0.1:8080/hook", "https://inside.test/hook",
                 "https://meta.test/hook", "https://nowhere.test/hook",
                 "https://metadata.google.internal/computeMetadata/v1/"]


@pytest.mark.parametrize("hook", REFUSED_HOOKS)
def test_the_api_refuses_a_status_webhook_it_may_not_call(
        api: tuple[FastAPI, dict[str, str]], hook: str) -> None:
    app, tokens = api
    client = TestClient(app, raise_server_exceptions=False)
    auth = {"Authorization": f"Bearer {tokens['acme']}"}
    r = client.post("/v1/messages", json={**SMS, "status_webhook": hook}, headers=auth)
    assert r.status_code == 422, r.text
    assert r.json()["reason"] == "webhook_url_not_allowed"
    assert r.json()["field"] == "status_webhook"
    assert "10.0.0.9" not in r.text and "169.254" not in r.json()["message"]
    batch = client.post("/v1/messages:batch", headers=auth,
                        json={"messages": [{**SMS, "status_webhook": hook}]})
    [item] = batch.json()["results"]
    assert (item["code"], item["reason"]) == (422, "webhook_url_not_allowed")


def test_the_api_refuses_such_a_webhook_in_schedules_and_campaigns(
        api: tuple[FastAPI, dict[str, str]]) -> None:
    app, tokens = api
    client = TestClient(app, raise_server_exceptions=False)
    schedule = client.post("/v1/schedules", headers={"Authorization": f"Bearer {tokens['acme']}"},
                           json={"cron": "0 9 * * *", "timezone": "UTC", "message": {
                               **SMS, "tier": "P2",
                               "status_webhook": "https://inside.test/x"}})
    assert (schedule.status_code, schedule.json()["reason"]) == (422, "webhook_url_not_allowed")
    campaign = client.post("/v1/campaigns", headers={"Authorization": f"Bearer {tokens['mkt']}"},
                           json={"name": "c", "channel": "SMS", "tier": "P3",
                                 "template_id": "winter", "template_version": 1,
                                 "manifest": "s3://notiflow/tenants/mkt/a.csv",
                                 "mapping": {"recipient": "phone"},
                                 "webhook": "http://169.254.169.254/latest/meta-data"})
    assert (campaign.status_code, campaign.json()["reason"]) == (422, "webhook_url_not_allowed")
    assert campaign.json()["field"] == "webhook"
