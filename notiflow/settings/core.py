"""The settings object: :class:`Settings`, with the fields that are no section of their own
(stores, local stack, processes, policy), where it reads them from (the environment,
``NOTIFLOW_SECRETS_DIR``, the ``NOTIFLOW_CONFIG`` file), and :func:`load_settings`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NestedSecretsSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from notiflow.providers.registry import DEFAULT_ROUTES, ProviderSections
from notiflow.schemas.enums import Category, Channel, Tier
from notiflow.settings.dead_letters import DlqRule
from notiflow.settings.observability import TelemetrySettings
from notiflow.settings.planning import CampaignRule, SchedulingRule
from notiflow.settings.plugin import ProviderSection, SectionSpec, section_specs, sections_of
from notiflow.settings.providers import (
    BreakerRule,
    ChatSettings,
    PaceRule,
    ProviderRoute,
    insecure_endpoint,
)
from notiflow.settings.rendering import PreferencePage, RenderLimits, SmsReplies, Unsubscribe
from notiflow.settings.security import EgressSettings, IngestBinding, IngestEncryption, JwtAuth
from notiflow.settings.serving import (
    ApiRedisTimeout,
    ApiTls,
    OutageWindow,
    ServerLimits,
)
from notiflow.settings.storage import ArchiveSettings, ObjectStoreSettings
from notiflow.settings.tenants import ClientWebhookRule, TenantConfig, _tenant_index
from notiflow.settings.tiers import (
    DEFAULT_CAPS,
    DEFAULT_SHARES,
    DEFAULT_TIERS,
    CapRule,
    CategoryTiers,
    QuietHours,
    TierPolicy,
    YieldRule,
)
from notiflow.settings.transport import (
    CassandraSecurity,
    KafkaSecurity,
    RedisSecurity,
    _ConfigFile,
)


class Settings(BaseSettings, ProviderSections):
    """Runtime configuration shared by every notiflow process; each registered provider
    plug-in (``ProviderSections``) adds its settings section as a field."""

    model_config = SettingsConfigDict(
        env_prefix="NOTIFLOW_",
        env_nested_delimiter="__",
        frozen=True,
        extra="ignore",
        hide_input_in_errors=True,
    )

    environment: Literal["development", "production"] = "production"
    """``development``: the local stack and the emulators (``notiflow.devenv``), where
    provider endpoints may be plain ``http`` anywhere and the API serves its docs;
    ``production``: provider endpoints are ``https`` (plain ``http`` only to a loopback
    address) and the docs are off unless ``api_docs`` turns them on."""
    api_docs: bool | None = None
    """Serve ``/docs``, ``/redoc`` and ``/openapi.json``; None: in development only."""

    # infrastructure (loopback, non-default ports)
    kafka_bootstrap: str = "127.0.0.1:19092"
    kafka_replication_factor: int = Field(1, ge=1, le=16)
    """Replicas of each topic notiflow creates (3 on a cluster: one broker may die)."""
    kafka_min_insync_replicas: int = Field(1, ge=1, le=16)
    """Replicas holding a record before ``acks=all`` acknowledges it, per topic (2 of 3 on a
    cluster); at most ``kafka_replication_factor``."""
    kafka_security: KafkaSecurity = KafkaSecurity()
    """TLS and SASL of every Kafka client (docs/operations.md, "Transport security")."""
    kafka_controller_port: int = 19093
    kafka_proxied_port: int = 19094
    """A third listener of the local stack's brokers, which advertises ``kafka_proxy_port``:
    a client that bootstraps there keeps every connection on that proxy (``notiflow chaos``
    puts toxiproxy on it; nothing listens there otherwise)."""
    kafka_proxy_port: int = 19095
    topic_prefix: str = ""
    ingest_partitions: int = Field(4, ge=1, le=256)
    events_partitions: int = Field(4, ge=1, le=256)
    cassandra_hosts: tuple[str, ...] = ("127.0.0.1",)
    cassandra_port: int = 19042
    cassandra_storage_port: int = 17000
    cassandra_jmx_port: int = 17199
    cassandra_keyspace: str = Field("notiflow", pattern=r"^[a-z][a-z0-9_]{0,47}$")
    cassandra_replication: dict[str, int] = Field(
        default_factory=lambda: {"datacenter1": 1}, min_length=1)
    """Replicas of the keyspace per data centre (``NetworkTopologyStrategy``), e.g.
    ``{"dc1": 3, "dc2": 3}``; the local stack's one node is ``datacenter1``."""
    cassandra_local_dc: str | None = None
    """The data centre this process talks to (the driver's ``DCAwareRoundRobinPolicy``; LOCAL_*
    consistency counts its replicas); None = the first of ``cassandra_replication``."""
    cassandra_security: CassandraSecurity = CassandraSecurity()
    """TLS and authentication of the Cassandra driver (docs/operations.md, "Transport
    security")."""
    cassandra_read_keys: int = Field(32, ge=1, le=256)
    """Keys per ``IN`` read of the reconciler (adapters/cassandra_coalesce.py)."""
    cassandra_batch_rows: int = Field(64, ge=1, le=1000)
    """Rows per unlogged batch of the reconciler; about 2 KiB a message's eight rows: keep
    rows x size under Cassandra's ``batch_size_fail_threshold`` (50 KiB by default)."""
    api_coalesce: bool = True
    """The API's message-row and settle writes of concurrent requests share unlogged
    batches (``cassandra_batch_rows`` rows), its head reads ``IN`` queries; a failed batch
    fails every request it carried (each is undone and answered 503). It halves a batch
    item's CPU in the API and in Cassandra (``notiflow bench api``;
    docs/decisions/2026-12-04-acceptance-path-cpu.md)."""
    api_settle_interval: timedelta = timedelta(milliseconds=10)
    """The API answers ``202`` once Kafka acknowledged; the settles (key ``ACCEPTED``, outbox
    row removed) queued during this interval are written together, off the response path
    (``gateway/settler.py``)."""
    api_fence: bool = True
    """A request with an ``Idempotency-Key`` takes the key's fence in Redis and writes its
    reservation plainly; off (or Redis unavailable): a Cassandra lightweight transaction per
    key (``adapters/idempotency_fence.py``, docs/api.md "Idempotency")."""
    api_redis_timeout: ApiRedisTimeout = ApiRedisTimeout()
    api_fence_ttl: timedelta = timedelta(seconds=60)
    """How long a fence outlives its ``SET``: longer than a reservation takes to be written."""
    api_batch_concurrency: int = Field(128, ge=1)
    """Batch items in acceptance at once in one API process, all batches together; the rest
    wait their turn. Bounds the event loop's queue, so that Redis and Kafka timeouts measure
    the stores, not the process's own backlog (per batch, concurrent batches filled the loop
    until fence calls timed out and every key fell back to a lightweight transaction)."""
    redis_url: str = "redis://127.0.0.1:16379/0"
    """``redis://host:port/db``, or ``redis+sentinel://h1:port,h2:port/service[/db]`` for the
    primary Redis Sentinel names (docs/operations.md, "Replication and consistency");
    ``rediss://`` and ``rediss+sentinel://`` for TLS."""
    redis_security: RedisSecurity = RedisSecurity()
    """TLS files and credentials of every Redis client (docs/operations.md, "Transport
    security")."""
    redis_port: int = 16379

    # local stack
    stack_dir: Path = Path(".stack")
    cache_dir: Path = Path.home() / ".cache" / "notiflow"
    kafka_version: str = "4.1.1"
    cassandra_version: str = "5.0.6"
    kafka_heap_mb: int = 384
    cassandra_heap_mb: int = 1024
    cassandra_flush_schema: bool = True
    """False: the local Cassandra keeps schema changes in its commit log without flushing the
    schema tables on each one (``cassandra.test.flush_local_schema_changes``), so creating a
    keyspace's tables takes about half as long. Only for a throw-away stack no one kills: a
    node SIGKILLed before its next flush may come back without the newest tables. The test
    command sets it for the stack it starts."""
    jvm_gc_realtime: int = Field(1, ge=0, le=99)
    """Real-time priority (``SCHED_RR``) ``notiflow stack up`` gives the local JVMs'
    stop-the-world collector threads (0: leave them at the normal priority). Every thread of
    a JVM waits while they run, so a pause lasts as long as they wait for a core (see
    ``ops/stack/jvm.py`` :func:`prioritise_collector`)."""
    java_home: Path | None = None

    # processes
    api_host: str = "127.0.0.1"
    api_port: int = 18080
    audit_p0_interval: timedelta = timedelta(minutes=1)
    """How often an API process writes its ``p0.use`` audit rows (P0 acceptances per tenant
    since the last ones)."""
    api_tls: ApiTls = ApiTls()
    """HTTPS and optional mutual TLS on the API (off: plain HTTP, e.g. behind a TLS
    terminating load balancer)."""
    api_lane: Literal["all", "priority", "bulk"] = "all"
    """Which requests this API process serves: ``all``; ``priority``: sends of priority-lane
    tiers (P0, P1), templates, recipients, reads; ``bulk``: sends of bulk-lane tiers (P2,
    P3), provider webhooks, the same reads, at the CPU niceness of the bulk lane's tiers.
    A send of the other lane's tier gets ``421 wrong_lane`` (docs/api.md, "Lanes")."""
    api_server: ServerLimits = ServerLimits()
    """What one API process takes at once (uvicorn's ``limit_concurrency``, ``backlog``,
    ``timeout_keep_alive``; a bound on a request's head)."""
    api_processes: int = Field(1, ge=1, le=64)
    """Worker processes of one ``notiflow api`` (``--processes``), sharing its socket under
    a supervisor. One process runs Python on about one core at most (the GIL): on a host
    with spare cores, one per core the API may use (docs/api.md, "Processes")."""
    fakes_host: str = "127.0.0.1"
    fakes_port: int = 18090
    flow_epoch_seconds: int = Field(5, ge=1)
    """Bytewax epoch length: offsets and state are committed to the recovery store at every
    epoch's end, and the worker stands still meanwhile (SQLite writes and fsyncs, racing
    every other writer of the disk). At 2 s the P0 flow's commits were a P0 stall every
    other second under the flood (``kafka`` stage, p99 489 ms; at 5 s 175 ms,
    docs/decisions/2026-12-02-p0-epoch-length.md); a longer epoch widens what a crashed flow
    re-reads,
    which the dedup leases make harmless. A tier's ``epoch`` overrides it for its send
    flow (P0: 30 s)."""
    reconcile_nice: int = Field(10, ge=0, le=19)
    bulk_yield: YieldRule = Field(default_factory=YieldRule)
    """How bulk work yields to P0's latency (docs/architecture.md, "Reservation")."""
    recovery_partitions: int = Field(4, ge=1)
    """Partitions of a flow's recovery store, fixed when the store is created: the most
    processes a flow's cluster can have."""
    cluster_settle_seconds: float = Field(20.0, ge=0)
    """A flow started with ``--peers-dns`` starts once its cluster's member count has held
    this long (``adapters/cluster_peers.py``)."""
    cluster_watch_seconds: float = Field(10.0, gt=0)
    """How often a member found in DNS re-counts its cluster (a change seen twice in a row
    restarts it)."""
    campaigns: CampaignRule = Field(default_factory=CampaignRule)
    """How campaigns expand and yield."""
    scheduling: SchedulingRule = Field(default_factory=SchedulingRule)
    """Where future P2/P3 work waits and how schedulers release it."""
    kafka_window: OutageWindow = Field(default_factory=OutageWindow)
    """What the API accepts while Kafka does not acknowledge."""
    object_store: ObjectStoreSettings = Field(default_factory=ObjectStoreSettings)
    """How ``s3://`` URIs are reached; the local stack's SeaweedFS (docs/operations.md)."""
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)
    """The history archive (docs/operations.md, "History archive")."""

    # policy
    tiers: dict[Tier, TierPolicy] = Field(default_factory=lambda: dict(DEFAULT_TIERS))
    time_scale: float = Field(1.0, gt=0)
    content_dedup_window: timedelta = timedelta(minutes=10)
    operational_ttl: timedelta = timedelta(days=30)
    idempotency_ttl: timedelta = timedelta(hours=24)
    outbox_sweep_after: timedelta = timedelta(seconds=30)
    max_variables_bytes: int = 16_384
    ordering_max_waiting: int = Field(1000, ge=1, le=1_000_000)
    """Messages one ``ordering_key`` holds in the send flow behind its head (a retry, a
    breaker wait); one more ends FAILED ``ordering_backlog`` (``flows/send/ordering.py``)."""

    # capacity and pressure (docs/design.md, "Caps and rate limits")
    mode: Literal["tiered", "shared"] = "tiered"
    """``shared``: one ingest topic, one flow, one worker pool for all tiers (benchmark
    baseline only)."""
    provider_rates: dict[str, float] = Field(
        default_factory=lambda: {"twilio": 1000.0, "vonage": 500.0, "sendgrid": 1000.0,
                                 "smtp": 200.0, "ses": 200.0, "fcm": 10_000.0,
                                 "apns": 10_000.0, "slack": 500.0, "teams": 500.0,
                                 "inbox": 5000.0})
    """Contracted requests/s per provider account."""
    tier_shares: dict[Tier, float] = Field(default_factory=lambda: dict(DEFAULT_SHARES))
    p0_emergency_rate: float = Field(0.0, ge=0)
    """Requests/s P0 may use beyond its reservation (an emergency quota)."""
    local_rate_fraction: float = Field(0.5, gt=0, le=1)
    """Share of a tier's reservation it may use on local limits while Redis is down."""
    caps: dict[Category, CapRule] = Field(default_factory=lambda: dict(DEFAULT_CAPS))
    default_quiet_hours: QuietHours = QuietHours()
    strong_consent_categories: frozenset[Category] = frozenset({Category.MARKETING})
    """Categories whose opt-out is re-checked in Cassandra at send (strong consistency)."""
    unknown_resolution: timedelta = timedelta(minutes=15)
    """How long an ambiguous attempt may wait for a receipt before it ends FAILED."""
    receipt_park_for: timedelta = timedelta(minutes=15)
    """How long a receipt for an unknown provider message id is retried before the DLQ."""
    retry_share: float = Field(0.25, gt=0, le=1)
    """Share of a channel's in-flight sends that retries may use (new traffic keeps the rest)."""

    # tenants and providers
    tenants: tuple[TenantConfig, ...] = ()
    jwt: JwtAuth = JwtAuth()
    """OAuth2 client-credentials JWTs (off by default: static tokens)."""
    routes: tuple[ProviderRoute, ...] = DEFAULT_ROUTES
    breaker: BreakerRule = BreakerRule()
    """Circuit breakers per provider account (``notiflow.adapters.breaker``)."""
    fakes_smtp_port: int = 18025
    fakes_ses_access_key_id: str | None = None
    fakes_ses_secret_access_key: SecretStr | None = None
    """The key pair the SES emulator accepts (besides ``ses``'s own, when configured)."""
    fakes_ses_sns_endpoint_url: str | None = None
    """Where the SES emulator's SNS topic delivers SES events (the API's ``/webhooks/ses``);
    unset: it publishes none."""
    fakes_apns_port: int = 18443
    fakes_apns_cert_file: Path | None = None
    """PEM certificate chain of the APNs emulator's TLS listener (a throw-away test CA's;
    ``notiflow.providers.apns.dev`` writes one). Unset: the APNs emulator does not listen."""
    fakes_apns_key_file: Path | None = None
    """PEM private key of that certificate."""

    provider_webhook_max_age: timedelta = timedelta(minutes=5)
    """Oldest (and furthest future) signed timestamp a provider webhook may carry (SendGrid,
    Vonage); older posts are refused as replays. Wall-clock, not scaled by ``time_scale``."""
    client_webhooks: ClientWebhookRule = ClientWebhookRule()
    egress: EgressSettings = EgressSettings()
    """Where tenant-supplied URLs may lead (docs/webhooks.md, "Allowed URLs")."""
    dlq: DlqRule = DlqRule()
    render_limits: RenderLimits = RenderLimits()
    """The budget of every template render (``NOTIFLOW_RENDER_LIMITS__CPU_TIME`` ...)."""
    unsubscribe: Unsubscribe = Unsubscribe()
    sms_replies: SmsReplies = SmsReplies()
    preference_page: PreferencePage = PreferencePage()
    category_tiers: CategoryTiers = CategoryTiers()
    """Tiers each message category may use (``NOTIFLOW_CATEGORY_TIERS__ALLOWED``, JSON)."""
    ingest_encryption: IngestEncryption = IngestEncryption()
    ingest_binding: IngestBinding = IngestBinding()
    telemetry: TelemetrySettings = TelemetrySettings()
    log_format: Literal["text", "json"] = "text"
    """Log lines: ``text`` for a terminal, ``json`` one event per line with trace and message
    ids (``NOTIFLOW_LOG_FORMAT``)."""

    # secrets
    dlq_key: SecretStr | None = None
    correlation_key: SecretStr | None = None
    """Key of the tags that make SMTP bounce addresses and campaign message ids unforgeable
    (``notiflow/correlation.py``); ``new,old`` during a rotation. Unset: derived from
    ``dlq_key``."""
    recipient_hash_key: SecretStr | None = None
    """Key of the pseudonymous recipient hashes (HMAC-SHA-256, ``notiflow/redact.py``) stored
    in Cassandra, Kafka keys, Redis keys and the archive; ``new,old`` during a rotation (the
    first hashes, every one is looked up). Unset: derived from ``dlq_key``."""
    recipient_hash_legacy: bool = False
    """Also look recipients up by the unkeyed SHA-256 hash of earlier releases (a migration
    window, docs/operations.md, "Recipient hashes"); off by default."""
    secrets_dir: Path | None = None
    """A directory of files named like ``NOTIFLOW_*`` environment variables, one value each
    (a mounted Kubernetes Secret), read as the environment is and winning over it. Set
    through the environment (``NOTIFLOW_SECRETS_DIR``); a missing directory is an error.
    Processes re-read it every ``secrets_poll`` and take changed tenants and provider
    accounts without a restart (``notiflow/secrets.py``, docs/operations.md)."""
    secrets_poll: timedelta = timedelta(seconds=10)
    """How often a process looks for a change in ``secrets_dir``."""
    secrets_rotation_window: timedelta = timedelta(hours=1)
    """How long a replaced tenant token or provider webhook secret is still accepted after a
    reload (old and new both valid); what the process itself signs or sends uses the new
    one at once."""

    @field_validator("secrets_poll")
    @classmethod
    def _positive_poll(cls, v: timedelta) -> timedelta:
        if v <= timedelta(0):
            raise ValueError("secrets_poll must be positive")
        return v

    @field_validator("content_dedup_window")
    @classmethod
    def _dedup_window_bounds(cls, v: timedelta) -> timedelta:
        if not timedelta(minutes=10) <= v <= timedelta(hours=24):
            raise ValueError("content_dedup_window must be between 10 minutes and 24 hours")
        return v

    @model_validator(mode="after")
    def _complete_tiers(self) -> Settings:
        missing = set(Tier) - set(self.tiers)
        if missing:
            merged = dict(DEFAULT_TIERS)
            merged.update(self.tiers)
            object.__setattr__(self, "tiers", merged)
        ids = [t.id for t in self.tenants]
        if len(ids) != len(set(ids)):
            raise ValueError("tenant ids must be unique")
        if self.kafka_min_insync_replicas > self.kafka_replication_factor:
            raise ValueError("kafka_min_insync_replicas exceeds kafka_replication_factor")
        if self.redis_security.tls_files and not self.redis_url.startswith("rediss"):
            raise ValueError("redis_security has TLS files but redis_url is not rediss:// "
                             "or rediss+sentinel://")
        for dc, rf in self.cassandra_replication.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", dc) or not 1 <= rf <= 16:
                raise ValueError(f"cassandra_replication: {dc!r}: {rf} is not a data centre "
                                 "name with 1-16 replicas")
        if self.cassandra_local_dc is not None and (
                self.cassandra_local_dc not in self.cassandra_replication):
            raise ValueError(f"cassandra_local_dc {self.cassandra_local_dc!r} is not a data "
                             f"centre of cassandra_replication "
                             f"({', '.join(self.cassandra_replication)})")
        if self.environment != "development":
            for name, url in self.provider_endpoints():
                if insecure_endpoint(url):
                    raise ValueError(f"{name}: plain http to a host other than loopback is "
                                     "allowed in development only (environment)")
        return self

    def provider_endpoints(self) -> list[tuple[str, str]]:
        """(setting, URL) of every endpoint the platform sends credentials or messages to:
        provider APIs, chat webhook prefixes, the identity provider's keys."""
        found = [(f"{name}.{field}", url)
                 for name, spec in section_specs(type(self)).items()
                 for field, url in spec.endpoints(getattr(self, name))]
        if self.jwt.jwks_url:
            found.append(("jwt.jwks_url", self.jwt.jwks_url))
        return found

    @property
    def serves_api_docs(self) -> bool:
        """Whether the API serves its docs and OpenAPI document (``api_docs``)."""
        return self.environment == "development" if self.api_docs is None else self.api_docs

    @property
    def cassandra_dc(self) -> str:
        """The driver's local data centre: ``cassandra_local_dc`` or the first replicated."""
        return self.cassandra_local_dc or next(iter(self.cassandra_replication))

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        secrets_dir = os.environ.get("NOTIFLOW_SECRETS_DIR")
        if secrets_dir:
            sources.insert(1, NestedSecretsSettingsSource(
                file_secret_settings, secrets_dir=secrets_dir, secrets_dir_missing="error",
                secrets_prefix="NOTIFLOW_", secrets_nested_delimiter="__"))
        config_file = os.environ.get("NOTIFLOW_CONFIG")
        if config_file:
            sources.append(_ConfigFile(settings_cls, Path(config_file)))
        return tuple(sources)

    # derived helpers -------------------------------------------------------------------

    def scaled(self, d: timedelta) -> timedelta:
        """A policy duration multiplied by ``time_scale`` (docs/design.md, "Time, retention and
        scale")."""
        return d * self.time_scale

    def policy(self, tier: Tier) -> TierPolicy:
        return self.tiers[tier]

    def lane_tiers(self, lane: str) -> frozenset[Tier]:
        """The tiers of ``lane`` (``all``: every tier)."""
        return frozenset(t for t, p in self.tiers.items() if lane in ("all", p.lane))

    def lane_nice(self, lane: str) -> int:
        """CPU niceness of a lane's shared processes: the least of its tiers' (0 for all)."""
        return 0 if lane == "all" else min(
            (self.tiers[t].nice for t in self.lane_tiers(lane)), default=0)

    def lane_realtime(self, lane: str) -> int:
        """Real-time priority of a lane's shared processes: the highest of its tiers' (0 for
        all: one process serving every tier stays in the normal scheduler)."""
        return 0 if lane == "all" else max(
            (self.tiers[t].realtime for t in self.lane_tiers(lane)), default=0)

    def tier_ttl(self, tier: Tier) -> timedelta:
        return self.scaled(self.tiers[tier].ttl)

    def share(self, tier: Tier) -> float:
        return self.tier_shares.get(tier, DEFAULT_SHARES[tier])

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def ingest_topic(self, channel: Channel, tier: Tier) -> str:
        """Where an accepted message of (channel, tier) goes; one topic for all in shared
        mode."""
        if self.mode == "shared":
            return self.shared_topic
        return self.topic(f"ingest.{Channel(channel).value.lower()}.{Tier(tier).value.lower()}")

    @property
    def shared_topic(self) -> str:
        return self.topic("ingest.shared")

    @property
    def webhooks_dlq_topic(self) -> str:
        return self.topic("notify.dlq.webhooks")

    def dlq_topic(self, tier: Tier | None) -> str:
        name = f"notify.dlq.{Tier(tier).value.lower()}" if tier else "notify.dlq.reconcile"
        return self.topic(name)

    @property
    def events_topic(self) -> str:
        return self.topic("notify.events")

    @property
    def delayed_topic(self) -> str:
        """Retries that wait ``scheduling.long_wait`` or more, on their way to a bucket."""
        return self.topic("notify.delayed")

    @property
    def receipts_topic(self) -> str:
        return self.topic("notify.receipts")

    @property
    def preferences_topic(self) -> str:
        return self.topic("notify.preferences")

    @property
    def users_topic(self) -> str:
        return self.topic("notify.users")

    def tenant_by_token(self, token: str) -> TenantConfig | None:
        """The tenant whose token this is (constant-time compare of the UTF-8 bytes: a header
        with non-ASCII characters is a wrong token, not an error)."""
        import hmac

        given = token.encode(errors="surrogateescape")
        for tenant in self.tenants:
            if tenant.token is not None and hmac.compare_digest(
                    tenant.token.get_secret_value().encode(), given):
                return tenant
        return None

    def tenant(self, tenant_id: str) -> TenantConfig | None:
        return _tenant_index(self.tenants).get(tenant_id)

    @classmethod
    def section_specs(cls) -> Mapping[str, SectionSpec]:
        """Section name → how to read it, for every provider plug-in of this settings class
        (the registry's, in its order)."""
        return section_specs(cls)

    def provider_sections(self) -> dict[str, ProviderSection]:
        """Section name → the provider account's settings section, in registry order."""
        return {name: getattr(self, name) for name in section_specs(type(self))}

    def enabled_providers(self) -> frozenset[str]:
        """Provider accounts whose credentials are configured (the router's candidates)."""
        enabled = set()
        for name, spec in section_specs(type(self)).items():
            section = getattr(self, name)
            if spec.enabled(section):
                enabled.add(section.provider_id)
        return frozenset(enabled)

    def chat_sections(self) -> list[ChatSettings]:
        """The sections of the incoming-webhook chat providers."""
        return [getattr(self, name) for name in sections_of(type(self), ChatSettings)]

    def webhook_prefixes(self) -> dict[str, tuple[str, ...]]:
        """Chat provider id → the webhook URL prefixes it serves."""
        return {c.provider_id: c.webhook_prefixes for c in self.chat_sections()}

    def pace(self, provider_id: str) -> PaceRule | None:
        """The per-webhook pace of a chat provider; None for every other provider."""
        for chat in self.chat_sections():
            if chat.provider_id == provider_id:
                return chat.pace
        return None

    def enabled_channels(self) -> frozenset[Channel]:
        """Channels with at least one configured provider; others are refused at admission."""
        enabled = self.enabled_providers()
        return frozenset(r.channel for r in self.routes if r.provider_id in enabled)


def load_settings(**overrides: Any) -> Settings:
    """Build the settings object once per process (overrides win over env and file)."""
    return Settings(**overrides)
