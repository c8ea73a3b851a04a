"""The in-app inbox plug-in's settings section (``NOTIFLOW_INBOX__...``)."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from pydantic import Field

from notiflow.schemas.enums import Channel
from notiflow.settings.plugin import ProviderPlugin, SectionSpec
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen
from notiflow.settings.serving import ServerLimits


class InboxSettings(_Frozen):
    """The in-app channel (``docs/inbox.md``): messages to ``inapp:<user id>`` are stored in
    the user's inbox (Cassandra) by the send flow and pushed live by ``notiflow inbox`` to the
    user's open apps (WebSocket, or server-sent events), which authenticate with a user token
    signed by their tenant (``TenantConfig.inbox_keys``)."""

    provider_id: str = "inbox"
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(18110, ge=1, le=65535)
    """Where ``notiflow inbox`` listens."""
    retention: timedelta = timedelta(days=30)
    """How long an inbox item is kept (Cassandra TTL)."""
    page_size: int = Field(50, ge=1, le=500)
    """Items per page of ``GET /v1/inbox`` unless ``limit`` asks for fewer or more."""
    max_page: int = Field(200, ge=1, le=1000)
    token_audience: str = "notiflow-inbox"
    """The ``aud`` every user token must name."""
    max_token_lifetime: timedelta = timedelta(hours=24)
    """Longest ``exp - iat`` a user token may have."""
    token_leeway: timedelta = timedelta(seconds=30)
    max_connections_per_user: int = Field(10, ge=1, le=1000)
    """Live connections of one user (a new one beyond closes the oldest)."""
    send_queue: int = Field(256, ge=1, le=100_000)
    """Frames waiting for a slow client before its connection is closed (it reconnects and
    catches up from the inbox)."""
    heartbeat: timedelta = timedelta(seconds=25)
    """Ping (WebSocket) or comment (SSE) interval, so proxies keep idle connections."""
    max_connections: int = Field(20_000, ge=1, le=1_000_000)
    """Live connections of this process, all tenants together: one more is refused ``503``
    before the upgrade."""
    max_connections_per_tenant: int = Field(5_000, ge=1, le=1_000_000)
    """Live connections of one tenant's users in this process: one more is refused ``429``
    before the upgrade."""
    connect_rate: float = Field(50.0, gt=0)
    """Connections per second one tenant's users may open (a token bucket of
    ``connect_burst``): a faster one is refused ``429`` with ``Retry-After``."""
    connect_burst: int = Field(200, ge=1)
    server: ServerLimits = ServerLimits()
    """The process's listen backlog and keep-alive; ``max_concurrency`` and
    ``max_head_bytes`` do not apply (the connection caps above do, and aiohttp bounds a
    request's head itself: 8190-byte lines and fields, 128 headers)."""


def enabled(section: InboxSettings) -> bool:
    """The inbox is on."""
    return section.enabled


class InboxPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "inbox", InboxSettings, enabled,
        ProviderRoute(provider_id="inbox", channel=Channel.INAPP, cost=0.0, reliability=0.999),
        reloadable=False)
    inbox: InboxSettings = InboxSettings()
