"""The HTTP servers: what one server process takes at once, the API's TLS, Redis timeouts
and Kafka outage window, and the in-app inbox server."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from notiflow.settings.section import _Frozen


class ServerLimits(_Frozen):
    """What one HTTP server process takes at once (docs/api.md, "Limits"): beyond
    ``max_concurrency`` open connections or requests in progress a new request is answered
    ``503``; the kernel queues ``backlog`` connections not accepted yet; an idle keep-alive
    connection is closed after ``keep_alive``; a request line and headers that pass
    ``max_head_bytes`` unfinished close the connection."""

    max_concurrency: int = Field(1000, ge=1, le=1_000_000)
    backlog: int = Field(2048, ge=1, le=65535)
    keep_alive: timedelta = timedelta(seconds=5)
    max_head_bytes: int = Field(64 * 1024, ge=1024, le=1024 * 1024)


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


class OutageWindow(_Frozen):
    """How one API process accepts while Kafka does not acknowledge (docs/design.md,
    "Failures of the stores"; ``gateway/kafka_window.py``, docs/api.md "Kafka outage"). Not
    scaled by ``time_scale``."""

    max_messages: int = Field(20_000, ge=0)
    """P1-P3 acceptances answered ``202`` from Cassandra's durability alone and not yet
    published, per API process; beyond, ``503`` with ``Retry-After``. 0: no window."""
    max_age: timedelta = Field(timedelta(minutes=10), gt=timedelta(0))
    """The oldest unpublished record may be this old; beyond, new acceptances get ``503``."""
    ack_wait: timedelta = Field(timedelta(seconds=1), gt=timedelta(0))
    """How long a P1-P3 request waits for Kafka's ack before it is answered from the
    window."""
    p0_ack_wait: timedelta = Field(timedelta(milliseconds=400), gt=timedelta(0))
    """How long a P0 request waits for the ack before it is refused: P0 must reach its
    provider within a second, so it is never deferred."""
    probe_interval: timedelta = Field(timedelta(seconds=1), gt=timedelta(0))
    """How often a process with deferred records (or that saw Kafka fail) tries Kafka."""
    drain_concurrency: int = Field(256, ge=1)
    """Deferred records in flight to Kafka at once while the window drains."""


class ApiRedisTimeout(_Frozen):
    """How long the API waits for Redis (admission, idempotency fences), per lane, before it
    takes Redis for down (a second of fallbacks: local admission for P0/P1, 503 for P2/P3,
    fences by transaction)."""

    all: timedelta = timedelta(milliseconds=250)
    priority: timedelta = timedelta(milliseconds=150)
    """P0 asks Redis twice before Kafka (admission, fence): a Redis slower than this is
    down for P0's purposes (its SLA is 1 s)."""
    bulk: timedelta = timedelta(milliseconds=250)

    def of(self, lane: str) -> timedelta:
        return {"priority": self.priority, "bulk": self.bulk}.get(lane, self.all)


class ApiTls(_Frozen):
    """HTTPS on the API, optionally with client certificates (mutual TLS). Off while
    ``cert_file`` is unset. Client certificates are checked at the handshake only; who the
    caller is still comes from its bearer token."""

    cert_file: Path | None = None
    """PEM certificate chain of the API (its leaf first)."""
    key_file: Path | None = None
    """PEM private key of ``cert_file`` (unencrypted: mount it from a secret)."""
    client_ca_file: Path | None = None
    """PEM bundle of the CA(s) whose client certificates are accepted."""
    client_certs: Literal["none", "optional", "required"] = "none"
    """Whether a client must present a certificate signed by ``client_ca_file``."""

    @model_validator(mode="after")
    def _coherent(self) -> ApiTls:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("api_tls.cert_file and api_tls.key_file go together")
        if self.client_certs != "none" and (self.client_ca_file is None
                                            or self.cert_file is None):
            raise ValueError("api_tls.client_certs needs api_tls.cert_file and "
                             "api_tls.client_ca_file")
        return self
