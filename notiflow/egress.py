"""Where a tenant-supplied URL may lead: pure rules over a URL and its resolved addresses.

A URL passes when its scheme is ``https`` (``http`` only with ``egress.allow_http``), its
host is a name or a canonical IP literal, and every address it stands for is public unicast.
Refused (:func:`address_class` names the class): loopback, private (RFC 1918), link-local,
shared address space (CGNAT, 100.64/10), unique local (fc00::/7), multicast, unspecified,
documentation, benchmarking and reserved ranges, IPv6 outside global unicast (2000::/3,
except NAT64 ``64:ff9b::/96``), and the cloud metadata addresses. An IPv6 address that embeds
an IPv4 one (IPv4-mapped, IPv4-compatible, SIIT, NAT64, 6to4) is judged by the embedded one
too. ``egress.allow_networks`` and ``egress.allow_hosts`` let chosen non-public addresses
through; nothing lets a metadata address or host name through.

Parsing is yarl's, as the sender (aiohttp) parses, so the host checked is the host
connected to.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import (
    IPv4Address,
    IPv4Network,
    IPv6Address,
    IPv6Network,
    ip_address,
    ip_network,
)

from yarl import URL

from notiflow.settings import EgressSettings

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OCI, DigitalOcean, OpenStack instance metadata
    "169.254.169.253",  # AWS VPC DNS
    "169.254.169.123",  # AWS time sync
    "169.254.170.2",    # AWS ECS task metadata and credentials
    "169.254.170.23",   # AWS EKS pod identity agent
    "100.100.100.200",  # Alibaba Cloud metadata
    "168.63.129.16",    # Azure wire server (a public address)
    "192.0.0.192",      # Oracle Cloud legacy metadata
    "fd00:ec2::254",    # AWS metadata over IPv6
    "fd00:ec2::23",     # AWS EKS pod identity agent over IPv6
    "fd20:ce::254",     # GCP metadata over IPv6
))
"""Refused whatever the allow-lists say."""

METADATA_HOSTS: frozenset[str] = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data",
    "instance-data.ec2.internal", "metadata.azure.com", "metadata.tencentyun.com",
})
"""Host names of metadata services, refused before any lookup."""

_V4_RANGES: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(net), label) for net, label in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "cgnat"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link_local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "documentation"),
        ("192.31.196.0/24", "reserved"),
        ("192.52.193.0/24", "reserved"),
        ("192.88.99.0/24", "reserved"),
        ("192.168.0.0/16", "private"),
        ("192.175.48.0/24", "reserved"),
        ("198.18.0.0/15", "benchmark"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
    ))
_V6_RANGES: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(net), label) for net, label in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fe80::/10", "link_local"),
        ("fec0::/10", "link_local"),
        ("fc00::/7", "ula"),
        ("ff00::/8", "multicast"),
        ("2001::/23", "reserved"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("64:ff9b:1::/48", "private"),
    ))
_GLOBAL_UNICAST = IPv6Network("2000::/3")
_NAT64 = IPv6Network("64:ff9b::/96")
_SIIT = IPv6Network("::ffff:0:0:0/96")
_V4_COMPATIBLE = IPv6Network("::/96")
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)")


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL that passed the URL rules leads: ``host`` as the sender looks it up
    (lower case, IDNA-encoded), ``address`` when the host is an IP literal."""

    scheme: str
    host: str
    port: int
    address: IPAddress | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a URL may not be called: ``kind`` a short code (``scheme``, ``host``,
    ``metadata``, ``loopback``, ...), ``detail`` a sentence safe to show the tenant."""

    kind: str
    detail: str


def embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, IPv4-compatible, SIIT,
    NAT64 ``64:ff9b::/96``, 6to4), else None."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _SIIT or (ip in _V4_COMPATIBLE and int(ip) > 1):
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _own_class(ip: IPAddress) -> str | None:
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if isinstance(ip, IPv4Address):
        for net, label in _V4_RANGES:
            if ip in net:
                return label
        return None if ip.is_global else "reserved"
    for net6, label in _V6_RANGES:
        if ip in net6:
            return label
    if ip in _NAT64:
        return None
    if ip not in _GLOBAL_UNICAST:
        return "reserved"
    return None if ip.is_global else "reserved"


def address_class(ip: IPAddress) -> str | None:
    """The refused class of ``ip`` (``metadata``, ``loopback``, ``private``, ...), or None
    for a public unicast address. An IPv4-mapped address is its IPv4 address; another IPv6
    form that embeds an IPv4 address is refused when either is; a zone id is ignored."""
    if isinstance(ip, IPv6Address):
        ip = IPv6Address(int(ip))
        if ip.ipv4_mapped is not None:
            return _own_class(ip.ipv4_mapped)
        embedded = embedded_ipv4(ip)
        if embedded is not None:
            inner = _own_class(embedded)
            if inner is not None:
                return inner
    return _own_class(ip)


def _allowed(ip: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    forms: list[IPAddress] = [ip]
    if isinstance(ip, IPv6Address):
        forms = [IPv6Address(int(ip))]
        if ip.ipv4_mapped is not None:
            forms.append(ip.ipv4_mapped)
    return any(f.version == n.version and f in n for f in forms for n in networks)


def check_address(ip: IPAddress, rule: EgressSettings, host: str | None = None
                  ) -> Refusal | None:
    """None when ``ip`` may be called: public unicast, or allowed by ``rule``
    (``allow_networks``, or ``host`` in ``allow_hosts``) and not a metadata address."""
    kind = address_class(ip)
    if kind is None:
        return None
    if kind != "metadata" and (_allowed(ip, rule.allow_networks)
                               or (host is not None and host in rule.allow_hosts)):
        return None
    if kind == "metadata":
        return Refusal(kind, "the URL leads to a cloud metadata address")
    return Refusal(kind, f"the URL leads to a {kind.replace('_', '-')} address; only "
                         "public addresses may be called")


def _literal(host: str) -> IPAddress | None:
    try:
        return ip_address(host.replace("%25", "%"))
    except ValueError:
        return None


def check_url(url: str, rule: EgressSettings) -> Target | Refusal:
    """The URL rules (scheme, host form, literal address); the :class:`Target` to resolve
    when they pass."""
    try:
        parsed = URL(url)
        host = parsed.raw_host
        port = parsed.port
    except (ValueError, TypeError, UnicodeError):
        return Refusal("url", "the URL does not parse")
    scheme = parsed.scheme.lower()
    if scheme not in ("http", "https") or not parsed.is_absolute():
        return Refusal("scheme", "the URL must be an absolute https URL")
    if scheme == "http" and not rule.allow_http:
        return Refusal("scheme", "the URL must use https")
    if not host or port is None or not 0 < port < 65536:
        return Refusal("host", "the URL names no host and port that can be called")
    host = host.lower()
    address = _literal(host)
    if address is not None:
        refusal = check_address(address, rule)
        return refusal or Target(scheme, host, port, address)
    name = host.rstrip(".")
    if ":" in host or not name or _NUMERIC_LABEL.fullmatch(name.rsplit(".", 1)[-1]):
        return Refusal("host", "the URL's host is neither a name nor a canonical address")
    if name in METADATA_HOSTS:
        return Refusal("metadata", "the URL leads to a cloud metadata service")
    return Target(scheme, host, port)


def check_resolved(target: Target, addresses: Iterable[IPAddress],
                   rule: EgressSettings) -> Refusal | None:
    """None when the name resolved to at least one address and every one passes
    :func:`check_address` (a name with one refused address is refused as a whole: its
    answers may change between lookups)."""
    found = tuple(addresses)
    if not found:
        return Refusal("unresolvable", "the URL's host does not resolve")
    name = target.host.rstrip(".")
    for ip in found:
        if check_address(ip, rule, name) is not None:
            return Refusal("not_public", "the URL's host does not resolve to public "
                                         "addresses only")
    return None


def network(text: str) -> IPNetwork:
    """``ip_network`` for allow-lists written as text (tests, tools)."""
    return ip_network(text, strict=False)
