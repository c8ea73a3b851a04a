"""Resolving and pinning tenant-supplied URLs (the rules are ``notiflow/egress.py``).

:class:`EgressGuard` vets a URL: the URL rules, then one lookup of its host through the
:class:`Resolver` port (bounded by ``egress.resolve_timeout``), then the address rules on
every address found. A vetted URL is called through a session whose connector uses
:class:`PinnedResolver`: it answers only with the addresses vetted for the request in
progress (:func:`pinned`) and refuses any other lookup, so the connection goes to the
address checked (no second lookup a rebinding DNS server could answer differently) while the
``Host`` header, TLS SNI and certificate verification keep the URL's host name.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from ipaddress import ip_address
from typing import Literal, Protocol

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from notiflow.egress import IPAddress, Refusal, Target, check_resolved, check_url
from notiflow.settings import EgressSettings

CACHE_TTL_S = 30.0
"""How long one host's verdict is reused (a lookup per POST would cost a thread each)."""
CACHE_SIZE = 4096


class Resolver(Protocol):
    """Addresses of a host name; raises ``OSError`` when it has none."""

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]: ...


def _addresses(infos: Sequence[tuple[object, ...]]) -> tuple[IPAddress, ...]:
    found: dict[IPAddress, None] = {}
    for info in infos:
        sockaddr = info[4]
        if isinstance(sockaddr, tuple) and sockaddr and isinstance(sockaddr[0], str):
            found[ip_address(sockaddr[0].split("%", 1)[0])] = None
    return tuple(found)


class SystemResolver:
    """``getaddrinfo`` on a few threads of its own, so slow lookups of tenant names never
    take the event loop's default executor."""

    def __init__(self, threads: int = 8) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="egress-dns")

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        infos = await asyncio.get_running_loop().run_in_executor(self._pool, lookup)
        return _addresses(infos)


class StaticResolver:
    """A fixed table of names (tests, tools); any other name does not resolve."""

    def __init__(self, table: Mapping[str, Sequence[str]]) -> None:
        self.table = {k.lower().rstrip("."): tuple(ip_address(a) for a in v)
                      for k, v in table.items()}
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        self.asked.append(host)
        found = self.table.get(host.lower().rstrip("."))
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} does not resolve")
        return found


@dataclass(frozen=True, slots=True)
class Vetted:
    """A URL that may be called, and the addresses it may be called at."""

    url: str
    host: str
    port: int
    addresses: tuple[IPAddress, ...]


@dataclass(frozen=True, slots=True)
class Denied:
    """A URL that may not be called: ``not_allowed`` (the rules refuse it) or
    ``unresolvable`` (no address within the timeout); ``detail`` is safe to show the
    tenant (it never names the addresses a name resolved to)."""

    reason: Literal["not_allowed", "unresolvable"]
    kind: str
    detail: str


Verdict = Vetted | Denied


class EgressGuard:
    """Vets URLs by the rules of ``egress`` settings; verdicts on names are kept for
    ``CACHE_TTL_S`` (at most ``CACHE_SIZE``), so a burst to one endpoint costs one lookup."""

    def __init__(self, rule: EgressSettings, resolver: Resolver | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rule = rule
        self.resolver = resolver or SystemResolver(rule.resolvers)
        self.clock = clock
        self._cache: OrderedDict[tuple[str, int], tuple[float, Verdict]] = OrderedDict()

    async def vet(self, url: str) -> Verdict:
        target = check_url(url, self.rule)
        if isinstance(target, Refusal):
            return Denied("not_allowed", target.kind, target.detail)
        if target.address is not None:
            return Vetted(url, target.host, target.port, (target.address,))
        key = (target.host, target.port)
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            self._cache.move_to_end(key)
            verdict = hit[1]
        else:
            verdict = await self._lookup(target)
            self._cache[key] = (now + CACHE_TTL_S, verdict)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        if isinstance(verdict, Vetted):
            return Vetted(url, verdict.host, verdict.port, verdict.addresses)
        return verdict

    async def _lookup(self, target: Target) -> Verdict:
        try:
            async with asyncio.timeout(self.rule.resolve_timeout.total_seconds()):
                found = await self.resolver.resolve(target.host.rstrip("."), target.port)
        except (OSError, TimeoutError, UnicodeError, ValueError):
            return Denied("unresolvable", "unresolvable", "the URL's host does not resolve")
        refusal = check_resolved(target, found, self.rule)
        if refusal is not None:
            reason: Literal["not_allowed", "unresolvable"] = (
                "unresolvable" if refusal.kind == "unresolvable" else "not_allowed")
            return Denied(reason, refusal.kind, refusal.detail)
        return Vetted("", target.host, target.port, tuple(found))


class NotVetted(OSError):
    """A connection was asked for a host no vetted request is in progress for."""


_PIN: ContextVar[Vetted | None] = ContextVar("notiflow_egress_pin", default=None)


@contextmanager
def pinned(vetted: Vetted) -> Iterator[None]:
    """Within this block, :class:`PinnedResolver` answers ``vetted``'s host with its
    addresses (one request's task)."""
    token = _PIN.set(vetted)
    try:
        yield
    finally:
        _PIN.reset(token)


class PinnedResolver(AbstractResolver):
    """aiohttp's resolver for tenant URLs: the vetted addresses of the request in progress,
    nothing else (no lookup of its own)."""

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        pin = _PIN.get()
        if pin is None or pin.host.rstrip(".") != host.lower().rstrip("."):
            raise NotVetted(f"no vetted addresses for {host}")
        return [ResolveResult(hostname=host, host=str(a), port=port,
                              family=socket.AF_INET6 if a.version == 6 else socket.AF_INET,
                              proto=0, flags=socket.AI_NUMERICHOST)
                for a in pin.addresses]

    async def close(self) -> None:
        return None


def pinned_connector(limit: int) -> aiohttp.TCPConnector:
    """A connector that connects only to vetted addresses (:class:`PinnedResolver`, no
    DNS cache of its own)."""
    return aiohttp.TCPConnector(limit=limit, resolver=PinnedResolver(), use_dns_cache=False,
                                enable_cleanup_closed=True)
