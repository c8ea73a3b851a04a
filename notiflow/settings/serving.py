"""The HTTP servers: what one server process takes at once, the API's TLS, Redis timeouts
and Kafka outage window (the in-app inbox's server is the inbox plug-in's section)."""

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
