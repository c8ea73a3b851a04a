"""Cassandra, the operational source of truth, as one object per session: a store per
aggregate over one :class:`~notiflow.adapters.cassandra.session.Statements`, so writes of
several aggregates can share a request (:meth:`CassandraStore.write_all`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from cassandra.cluster import Cluster, Session

from notiflow.adapters.cassandra.attempts import AttemptStore
from notiflow.adapters.cassandra.idempotency import IdempotencyStore
from notiflow.adapters.cassandra.listing import MessageListing
from notiflow.adapters.cassandra.messages import MessageStore
from notiflow.adapters.cassandra.recipients import RecipientStore
from notiflow.adapters.cassandra.session import Statements, Write, connect
from notiflow.adapters.cassandra.templates import TemplateStore
from notiflow.adapters.cassandra.topics import CassandraTopics
from notiflow.adapters.cassandra.user_sends import UserSendStore
from notiflow.adapters.rows import AttemptRow, MessageRow, TemplateRow
from notiflow.settings import Settings


class CassandraStore:
    """Every read and write notiflow makes to its Cassandra tables, by aggregate
    (``idempotency``, ``messages``, ``listing``, ``delivery``: attempts and receipts,
    ``templates``, ``recipients``, ``user_sends``, ``topics``). Also the
    :class:`~notiflow.adapters.ports.Messages` port."""

    def __init__(self, session: Session, settings: Settings) -> None:
        self.session = session
        self.settings = settings
        self.cql = Statements(session)
        self.idempotency = IdempotencyStore(self.cql, settings)
        self.messages = MessageStore(self.cql, settings)
        self.listing = MessageListing(self.cql, self.messages)
        self.delivery = AttemptStore(self.cql)
        self.templates = TemplateStore(self.cql)
        self.recipients = RecipientStore(self.cql)
        self.user_sends = UserSendStore(self.cql, settings)
        self.topics = CassandraTopics(self.cql)
        self.cql.prepare({"ping": "SELECT release_version FROM system.local"})

    def coalesce(self, *, max_keys: int, max_rows: int) -> CassandraStore:
        """From now on keyed reads (message heads, reservations, receipts, the provider
        message index) and :meth:`write_all` calls made in one event-loop turn share
        requests (:mod:`notiflow.adapters.cassandra_coalesce`); returns this store."""
        self.cql.coalesce(max_keys=max_keys, max_rows=max_rows)
        return self

    async def write_all(self, writes: Sequence[Write]) -> None:
        """Writes of any aggregate as one request (``Statements.write_all``)."""
        await self.cql.write_all(writes)

    def write_each(self, groups: Sequence[Sequence[Write]]) -> Awaitable[list[None]]:
        """:meth:`write_all` of every group at once (``Statements.write_each``)."""
        return self.cql.write_each(groups)

    async def ping(self) -> None:
        """One cheap read at the configured consistency; raises when Cassandra cannot answer."""
        await self.cql.run("ping", ())

    async def message(self, message_id: str) -> MessageRow | None:
        return await self.messages.get_message(message_id)

    async def get_template(self, tenant_id: str, template_id: str,
                           version: int) -> TemplateRow | None:
        return await self.templates.get_template(tenant_id, template_id, version)

    async def attempts(self, message_id: str) -> list[AttemptRow]:
        return await self.delivery.attempts(message_id)


@dataclass(frozen=True, slots=True)
class ClusterStore:
    """A store and the cluster its session belongs to, held as one worker resource: closing
    the worker (``WorkerLoop.close``) calls :meth:`shutdown`."""

    cluster: Cluster
    store: CassandraStore

    @classmethod
    async def open(cls, settings: Settings) -> ClusterStore:
        """Connect (on a thread: the driver blocks) and build the store over the session."""
        cluster, session = await asyncio.to_thread(connect, settings)
        return cls(cluster, CassandraStore(session, settings))

    def shutdown(self) -> None:
        self.cluster.shutdown()
