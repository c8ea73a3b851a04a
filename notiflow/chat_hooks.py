"""Chat webhook URLs, the recipients of the ``CHAT`` channel, and the prefixes that allow them.

The platform POSTs a chat message to its recipient, so an unchecked recipient would let a
tenant make the platform call any address it can reach (server-side request forgery). Each
chat provider names the URL prefixes it serves (``slack.webhook_prefixes``); a URL is served
when its scheme, host and port equal one prefix's and its path starts with that prefix's path.
A prefix host ``*.example.com`` stands for any host below ``example.com`` (not the domain
itself). Nothing else about a URL is trusted: user info, fragments, dot segments, encoded
slashes or dots and backslashes make it no webhook URL at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final
from urllib.parse import SplitResult, urlsplit

MAX_URL: Final = 2048
DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_HOST: Final = re.compile(r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*"
                          r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_UNSAFE_PATH: Final = re.compile(r"(%2e|%2f|%5c|\\)", re.IGNORECASE)
WEBHOOK_URL_PATTERN: Final = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/[^\s#\\]*$"
"""The JSON Schema pattern of a chat recipient (the rest is checked by :func:`webhook_url`)."""


@dataclass(frozen=True, slots=True)
class Prefix:
    """One allowed prefix: ``scheme://host[:port]/path``."""

    scheme: str
    host: str
    """Lower case; without the ``*.`` of a wildcard."""
    wildcard: bool
    port: int
    path: str

    def matches(self, url: SplitResult) -> bool:
        host = url.hostname or ""
        if self.wildcard:
            if not host.endswith("." + self.host):
                return False
        elif host != self.host:
            return False
        return (url.scheme == self.scheme and _port(url) == self.port
                and url.path.startswith(self.path))


def _port(url: SplitResult) -> int:
    return url.port if url.port is not None else DEFAULT_PORTS[url.scheme]


def webhook_url(value: str) -> SplitResult:
    """``value`` split, or ``ValueError`` saying why it is no webhook URL: an http(s) URL of at
    most 2,048 characters with a host name and a path, and without user info, fragment,
    whitespace, dot segments, encoded slashes or dots, or backslashes."""
    if len(value) > MAX_URL:
        raise ValueError(f"a webhook URL has at most {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f for c in value):
        raise ValueError("a webhook URL has no whitespace or control characters")
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises for a port out of range
    except ValueError as exc:
        raise ValueError(f"a webhook URL is a URL ({exc})") from None
    if url.scheme not in DEFAULT_PORTS:
        raise ValueError("a webhook URL is http or https")
    if "@" in url.netloc:
        raise ValueError("a webhook URL has no user info")
    if url.fragment or value.endswith("#"):
        raise ValueError("a webhook URL has no fragment")
    if not url.hostname or not _HOST.fullmatch(url.hostname):
        raise ValueError("a webhook URL names a host")
    segments = url.path.split("/")
    if not url.path.startswith("/") or any(s in (".", "..") for s in segments) \
            or _UNSAFE_PATH.search(url.path):
        raise ValueError("a webhook URL has a plain path (no dot segments, encoded slashes "
                         "or dots, or backslashes)")
    return url


@lru_cache(maxsize=256)
def parse_prefix(text: str) -> Prefix:
    """``text`` as a :class:`Prefix`; ``ValueError`` unless it is ``scheme://host[:port]/path``
    with an optional leading ``*.`` label and nothing after the path."""
    wildcard = "://*." in text
    url = webhook_url(text.replace("://*.", "://", 1))
    if url.query:
        raise ValueError(f"a webhook prefix has no query: {text!r}")
    host = url.hostname or ""
    if wildcard and "." not in host:
        raise ValueError(f"a wildcard prefix names a domain below the top level: {text!r}")
    return Prefix(url.scheme, host, wildcard, _port(url), url.path)


@lru_cache(maxsize=4096)
def _split(value: str) -> SplitResult | None:
    """``value`` split once per process (routing, rendering and the adapter each ask)."""
    try:
        return webhook_url(value)
    except ValueError:
        return None


def served(value: str, prefixes: Iterable[str]) -> bool:
    """Whether the webhook URL ``value`` starts with one of ``prefixes`` (False for a value
    that is no webhook URL)."""
    url = _split(value)
    return url is not None and any(parse_prefix(p).matches(url) for p in prefixes)


def slack_escaped(text: str) -> str:
    """``text`` with Slack's three control characters escaped (``&``, ``<``, ``>``): a template
    variable then shows as written and cannot mention ``@channel`` or disguise a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_TEAMS_MARKUP: Final = re.compile(
    r"(?P<char>[\\`*_\[\]~<>&])|^(?P<lead>[ \t]*)(?:(?P<num>\d+)(?P<dot>[.)])|(?P<mark>[#+=-]))",
    re.MULTILINE)


def _teams_sub(m: re.Match[str]) -> str:
    if m["char"] is not None:
        return "\\" + m["char"]
    if m["num"] is not None:
        return f"{m['lead']}{m['num']}\\{m['dot']}"
    return f"{m['lead']}\\{m['mark']}"


def teams_escaped(text: str) -> str:
    """``text`` shown as written in an Adaptive Card ``TextBlock`` (Teams' Markdown): its
    emphasis, code, link and strike-through characters, the ``<`` of an ``<at>`` mention or
    an autolink, ``&`` entities, and the markers a line may start with (headings, lists,
    quotes, rules) are backslash-escaped, so a template variable cannot mention, style or
    disguise a link."""
    return _TEAMS_MARKUP.sub(_teams_sub, text)
