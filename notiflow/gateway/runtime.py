"""Per-process resources of the API: one Cassandra store, Kafka producers, one Redis client
for admission control and idempotency fences.

A process that accepts P0 publishes P0 records through a producer of their own: its own
broker connection, whose requests the broker serves in order and apart from the other
tiers' (a tenant's 1,000-item batch never stands between an OTP and its ack).

Cassandra is connected lazily: one attempt at start-up, then retries in the background, so
the process starts (``/healthz`` answers) while Cassandra is down and requests get ``503``
until it is reachable. The producer never blocks start-up; an unreachable broker shows up as
a failed delivery after :data:`DELIVERY_TIMEOUT_MS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import jwt
from cassandra.cluster import Cluster, Session
from confluent_kafka.admin import AdminClient

from notiflow.adapters.admission import DOWN_BACKOFF_S, AdmissionStore
from notiflow.adapters.audit import AuditLog
from notiflow.adapters.campaign_notices import NoticeStore
from notiflow.adapters.campaign_store import CampaignStore
from notiflow.adapters.campaign_tally import CampaignTally
from notiflow.adapters.cassandra.forgetting import StoreForgetting
from notiflow.adapters.cassandra.session import connect
from notiflow.adapters.cassandra.store import CassandraStore
from notiflow.adapters.cassandra.users import CassandraUsers
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.egress import EgressGuard
from notiflow.adapters.idempotency_fence import Fence
from notiflow.adapters.inbox_store import InboxStore
from notiflow.adapters.jwks import JwksCache
from notiflow.adapters.kafka_io import AsyncProducer, kafka_config
from notiflow.adapters.manifests import Manifests
from notiflow.adapters.outages import STORE_FAILURE
from notiflow.adapters.preferences import PreferenceStore
from notiflow.adapters.retrying import until_up
from notiflow.adapters.rows import TemplateRow
from notiflow.adapters.schedule_store import ScheduleStore
from notiflow.adapters.scheduled_store import ScheduledStore
from notiflow.adapters.secret_watch import watcher
from notiflow.adapters.user_directory import UserDirectory
from notiflow.gateway.admission import Admission
from notiflow.gateway.auditor import Auditor
from notiflow.gateway.errors import unavailable
from notiflow.gateway.kafka_window import Publisher, Window
from notiflow.gateway.settler import Settler
from notiflow.providers.ses.sns_http import SnsCertificates
from notiflow.schemas.enums import Tier
from notiflow.secrets import Keyring, Reload
from notiflow.settings import Settings

log = logging.getLogger("notiflow.gateway")

DELIVERY_TIMEOUT_MS = 5_000
CONNECT_TIMEOUT_S = 5.0
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 5.0
PROBE_TIMEOUT_S = 2.0
TEMPLATE_CACHE_SIZE = 4096
TOPICS_TTL_S = 30.0
TOPICS_RECHECK_S = 5.0
P0_CLIENT_ID = "notiflow-api-p0"


def api_producer_overrides() -> dict[str, Any]:
    """Short delivery deadline: a dead broker yields ``503`` within ~5 s, not 30 s."""
    return {
        "delivery.timeout.ms": DELIVERY_TIMEOUT_MS,
        "request.timeout.ms": DELIVERY_TIMEOUT_MS,
        "linger.ms": 1,
    }


def open_user_stores(session: Session, store: CassandraStore, settings: Settings
                     ) -> tuple[CassandraUsers, InboxStore] | None:
    """The stores of users and their inboxes; None without a DLQ key to seal them."""
    if settings.dlq_key is None:
        return None
    cipher = DlqCipher.from_settings(settings)
    return CassandraUsers(store.cql, cipher), InboxStore(session, settings, cipher)


def now_ms() -> datetime:
    """Current UTC time truncated to milliseconds (Cassandra's timestamp precision)."""
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


_T = TypeVar("_T")


def _reached(store: _T | None) -> _T:
    """``store`` once Cassandra has been reached; raises a ``503`` error before."""
    if store is None:
        raise unavailable("cassandra_unavailable", "the message store is unavailable")
    return store


class Runtime:
    """Owns the store, the producer, admission control and the background tasks of one API
    process."""

    def __init__(self, settings: Settings) -> None:
        self.keyring = Keyring(settings)
        """The settings in force (tenants and provider accounts reload from
        ``NOTIFLOW_SECRETS_DIR``) and the retired ones still valid for verification."""
        self._store: CassandraStore | None = None
        self._scheduled: ScheduledStore | None = None
        self._schedules: ScheduleStore | None = None
        self._campaigns: CampaignStore | None = None
        self._notices: NoticeStore | None = None
        self._manifests: Manifests | None = None
        self._tally: CampaignTally | None = None
        self._user_stores: tuple[CassandraUsers, InboxStore] | None = None
        self._cluster: Cluster | None = None
        self._producer: AsyncProducer | None = None
        self._p0_producer: AsyncProducer | None = None
        self._admin: AdminClient | None = None
        self._admission: Admission | None = None
        self._fence: Fence | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.window = Window(settings.kafka_window)
        self.publisher = Publisher(self.window, self.producer_for, self.spawn, self._kafka_up)
        self.settler = Settler(settings.api_settle_interval.total_seconds())
        self.batch_items = asyncio.Semaphore(settings.api_batch_concurrency)
        """Turns of batch items (``batch.py``) in this process."""
        self._templates: OrderedDict[tuple[str, str, int], TemplateRow] = OrderedDict()
        self._jwks: JwksCache | None = None
        self._sns: SnsCertificates | None = None
        self._topics: tuple[float, frozenset[str]] | None = None
        self.auditor = Auditor(settings)
        self.egress = EgressGuard(settings.egress)
        """Vets tenant-supplied URLs at acceptance (``gateway/egress_check.py``)."""
        self._closed = False

    @property
    def settings(self) -> Settings:
        return self.keyring.settings

    async def _reloaded(self, change: Reload) -> None:
        self.auditor.reconfigure(self.settings)

    async def signing_key(self, kid: str) -> jwt.PyJWK | None:
        """The identity provider's key ``kid`` (``settings.jwt``; keys cached per process)."""
        if self._jwks is None:
            rule = self.settings.jwt
            assert rule.jwks_url is not None, "JWT authentication is not configured"
            self._jwks = JwksCache(rule.jwks_url, httpx.AsyncClient(timeout=5.0),
                                   ttl=rule.keys_ttl.total_seconds(),
                                   min_refetch=rule.min_refetch.total_seconds())
        return await self._jwks.key(kid)

    def sns(self) -> SnsCertificates:
        """SNS signing certificates (cached per process) and subscription confirmations."""
        if self._sns is None:
            self._sns = SnsCertificates(
                httpx.AsyncClient(timeout=5.0, follow_redirects=False),
                ttl=self.settings.ses.sns_cert_ttl.total_seconds())
        return self._sns

    async def start(self) -> None:
        """Create the producer and the Redis client, try Cassandra once, keep retrying in
        the background."""
        self._producer = AsyncProducer(self.settings, **api_producer_overrides())
        if Tier.P0 in self.settings.lane_tiers(self.settings.api_lane):
            self._p0_producer = AsyncProducer(self.settings, **api_producer_overrides(),
                                              **{"client.id": P0_CLIENT_ID})
        self._admission = Admission(self.settings, AdmissionStore.open(self.settings))
        if self.settings.api_fence:
            store = self._admission.store
            self._fence = Fence(store.r, self.settings.topic_prefix,
                                self.settings.api_fence_ttl, timeout_s=store.timeout_s,
                                down_backoff_s=DOWN_BACKOFF_S, health=store.health)
        self._admin = AdminClient(kafka_config(self.settings),
                                  logger=logging.getLogger("notiflow.kafka.admin"))
        self.spawn(self.auditor.run(), "audit")
        watch = watcher(self.keyring, self._reloaded)
        if watch is not None:
            self.spawn(watch.run(), "secrets")
        try:
            await self._connect()
        except STORE_FAILURE as exc:
            log.warning("cassandra not reachable yet (%s); retrying in background",
                        type(exc).__name__)
            self.spawn(self._connect_loop(), "cassandra-connect")

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run a background task owned by this runtime (cancelled on :meth:`close`)."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self) -> None:
        """Open the session and prepare the statements; raises while Cassandra is not ready
        (unreachable, or its schema not migrated yet)."""
        cluster, session = await asyncio.to_thread(
            connect, self.settings, connect_timeout=CONNECT_TIMEOUT_S)
        try:
            store = await asyncio.to_thread(CassandraStore, session, self.settings)
            if self.settings.api_coalesce:
                store.coalesce(max_keys=self.settings.cassandra_read_keys,
                               max_rows=self.settings.cassandra_batch_rows)
            scheduled = await asyncio.to_thread(ScheduledStore, session, self.settings)
            schedules = await asyncio.to_thread(ScheduleStore, session, self.settings)
            campaigns = await asyncio.to_thread(CampaignStore, session, self.settings)
            notices = await asyncio.to_thread(NoticeStore, session)
            audit_log = await asyncio.to_thread(AuditLog, session)
            user_stores = await asyncio.to_thread(open_user_stores, session, store,
                                                  self.settings)
        except BaseException:
            await asyncio.to_thread(cluster.shutdown)
            raise
        if self._closed:
            await asyncio.to_thread(cluster.shutdown)
            return
        self._cluster, self._store = cluster, store
        self._scheduled, self._schedules = scheduled, schedules
        self._campaigns, self._notices = campaigns, notices
        self._user_stores = user_stores
        self.auditor.attach(audit_log)
        log.info("connected to cassandra keyspace %s", self.settings.cassandra_keyspace)

    async def _connect_loop(self) -> None:
        await asyncio.sleep(RECONNECT_FIRST_S)
        await until_up("cassandra connect", self._connect, log, first=RECONNECT_FIRST_S,
                       most=RECONNECT_MAX_S, on=STORE_FAILURE)

    @property
    def connected(self) -> bool:
        return self._store is not None

    def store(self) -> CassandraStore:
        """The store; raises a ``503`` error while Cassandra has not been reached."""
        return _reached(self._store)

    def scheduled(self) -> ScheduledStore:
        """Scheduled work in Cassandra; raises a ``503`` error while Cassandra has not been
        reached."""
        return _reached(self._scheduled)

    def schedules(self) -> ScheduleStore:
        """Recurring schedules in Cassandra; 503 while Cassandra has not been reached."""
        return _reached(self._schedules)

    def manifests(self) -> Manifests:
        """Campaign manifests in object storage."""
        if self._manifests is None:
            self._manifests = Manifests(self.settings)
        return self._manifests

    def tally(self) -> CampaignTally:
        """Campaign delivery funnels in Redis."""
        if self._tally is None:
            self._tally = CampaignTally(self.admission.store.r, self.settings.topic_prefix,
                                        self.settings.operational_ttl)
        return self._tally

    def notices(self) -> NoticeStore:
        """Campaign state webhooks to send; 503 while Cassandra has not been reached."""
        return _reached(self._notices)

    def campaigns(self) -> CampaignStore:
        """Campaigns in Cassandra; 503 while Cassandra has not been reached."""
        return _reached(self._campaigns)

    async def template(self, tenant_id: str, template_id: str,
                       version: int) -> TemplateRow | None:
        """A template version. Versions are immutable, so found rows are cached (LRU of
        :data:`TEMPLATE_CACHE_SIZE`); misses are not, a version may be created later."""
        key = (tenant_id, template_id, version)
        row = self._templates.get(key)
        if row is not None:
            self._templates.move_to_end(key)
            return row
        row = await self.store().templates.get_template(tenant_id, template_id, version)
        if row is not None:
            self._templates[key] = row
            while len(self._templates) > TEMPLATE_CACHE_SIZE:
                self._templates.popitem(last=False)
        return row

    def producer(self) -> AsyncProducer:
        if self._producer is None:
            raise unavailable("kafka_unavailable", "the producer is not running")
        return self._producer

    def producer_for(self, tier: Tier) -> AsyncProducer:
        """P0's own producer for P0 records (where this process has one), else the shared
        one."""
        if tier is Tier.P0 and self._p0_producer is not None:
            return self._p0_producer
        return self.producer()

    def users(self) -> UserDirectory:
        """Users (write to Cassandra, then publish; erasure); ``503`` while Cassandra or
        Kafka is unavailable, or without ``NOTIFLOW_DLQ_KEY`` (profiles are sealed with it)."""
        store = self.store()
        if self._user_stores is None:
            raise unavailable("users_unavailable", "users need NOTIFLOW_DLQ_KEY (profiles "
                              "are stored encrypted with it)")
        records, inbox = self._user_stores
        preferences = self.preferences()
        return UserDirectory(records, self.producer(), self.settings.users_topic,
                             StoreForgetting(preferences, store.recipients, inbox,
                                             store.topics))

    def preferences(self) -> PreferenceStore:
        """Recipient state (write to Cassandra, then publish); ``503`` while either is
        unavailable."""
        return PreferenceStore(self.store().recipients, self.producer(),
                               self.settings.preferences_topic)

    @property
    def admission(self) -> Admission:
        if self._admission is None:
            raise unavailable("admission_unavailable", "the API is not started")
        return self._admission

    @property
    def fence(self) -> Fence | None:
        """Idempotency fences in Redis (None: off, every key reserved by transaction)."""
        return self._fence

    async def check_cassandra(self) -> str:
        """``"ok"`` or a short reason."""
        if self._store is None:
            return "not connected"
        try:
            await asyncio.wait_for(self._store.ping(), PROBE_TIMEOUT_S)
        except Exception as exc:
            return type(exc).__name__
        return "ok"

    async def check_kafka(self) -> str:
        """``"ok"`` when the broker answers a metadata request for an ingest topic."""
        admin = self._admin
        if admin is None:
            return "not started"
        try:
            meta = await asyncio.to_thread(admin.list_topics, timeout=PROBE_TIMEOUT_S)
        except Exception as exc:
            return type(exc).__name__
        return "ok" if meta.brokers else "no brokers"

    async def _kafka_up(self) -> bool:
        return await self.check_kafka() == "ok"

    async def topic_exists(self, topic: str) -> bool | None:
        """Whether the cluster has ``topic``; None when the broker does not answer. The topic
        list is kept for :data:`TOPICS_TTL_S`, and fetched again for a topic it lacks once it
        is :data:`TOPICS_RECHECK_S` old (a topic created since)."""
        now = asyncio.get_running_loop().time()
        cached = self._topics
        if cached is not None and topic in cached[1] and now - cached[0] < TOPICS_TTL_S:
            return True
        if cached is None or now - cached[0] >= TOPICS_RECHECK_S:
            admin = self._admin
            if admin is None:
                return None
            try:
                meta = await asyncio.to_thread(admin.list_topics, timeout=PROBE_TIMEOUT_S)
            except Exception:
                return None
            cached = self._topics = (now, frozenset(meta.topics))
        return topic in cached[1]

    async def close(self) -> None:
        """Stop background tasks, flush the producer, close the Cassandra connection."""
        self._closed = True
        await self.settler.close()
        await self.auditor.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for producer in (self._producer, self._p0_producer):
            if producer is not None:
                await asyncio.to_thread(producer.close, DELIVERY_TIMEOUT_MS / 1000)
        if self._admission is not None:
            with contextlib.suppress(Exception):
                await self._admission.store.aclose()
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.shutdown)
        if self._jwks is not None:
            await self._jwks.aclose()
        if self._sns is not None:
            await self._sns.aclose()
        self._store = None
