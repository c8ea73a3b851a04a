"""Flow tests run real dataflows in-process: close each worker's clients after every test.

A send flow runs on memory ports (:class:`MemorySend`, the ``memory_send`` fixture: no
server) unless what it checks only a server shows; then on the real stack (``stack``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage
from bytewax.testing import cluster_main, run_main

from notiflow.adapters.envelope import envelope, load
from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.memory import MemoryState, memory_ports
from notiflow.adapters.ports import OpenSendPorts
from notiflow.adapters.worker import close_all
from notiflow.schemas.enums import Tier
from notiflow.schemas.messages import DlqRecord, IngestRecord, StatusEvent
from notiflow.settings import Settings
from tests.helpers import signed


@pytest.fixture(autouse=True)
def _close_worker_resources() -> Iterator[None]:
    yield
    close_all()


Runner = Callable[[Any], None]
RUNNERS: dict[str, Runner] = {
    "1-worker": lambda flow: run_main(flow),
    "2-workers": lambda flow: cluster_main(flow, [], 0, worker_count_per_proc=2),
}


def put_template(stack: Settings, tenant: str, template_id: str, channel: str, body: str,
                 subject: str | None = None) -> int:
    """Write version 1 of a template straight to Cassandra; returns the version."""
    from notiflow.adapters.cassandra.session import connect
    from notiflow.adapters.cassandra.store import CassandraStore
    from notiflow.adapters.rows import TemplateRow
    from notiflow.templating import analyse

    info = analyse(subject, body)
    cluster, session = connect(stack)

    async def put() -> None:
        await CassandraStore(session, stack).templates.put_template(TemplateRow(
            tenant_id=tenant, template_id=template_id, version=1, channel=channel,
            subject=subject, body=body, variables=tuple(info.variables),
            checksum=info.checksum, created_at=datetime.now(UTC)))

    asyncio.run(put())
    cluster.shutdown()
    return 1


def bound(settings: Settings, topic: str, value: bytes) -> list[tuple[str, bytes]]:
    """The headers a direct producer of the tenant ``value`` names writes (``nf-binding``)."""
    return signed(settings, OutRecord(topic, None, value)).headers


def kmsg(settings: Settings, value: bytes, offset: int, tier: Tier = Tier.P1,
         key: bytes | None = None) -> KafkaSourceMessage:
    topic = settings.ingest_topic("SMS", tier)
    return KafkaSourceMessage(key=key, value=value, topic=topic,
                              headers=bound(settings, topic, value), latency=None,
                              offset=offset, partition=0,
                              timestamp=(1, int(datetime.now(UTC).timestamp() * 1000)))


def record(code: str, **extra: object) -> bytes:
    doc: dict[str, object] = {"channel": "SMS", "tier": "P1", "tenant_id": "acme",
                              "recipient": "+14155552671", "template_id": "flow-otp",
                              "template_version": 1, "variables": {"code": code}}
    doc.update(extra)
    return orjson.dumps(doc)


def decode(settings: Settings, out: list[OutRecord]) -> tuple[list[StatusEvent],
                                                              list[DlqRecord],
                                                              list[IngestRecord]]:
    events, dlq, retries = [], [], []
    for r in out:
        if r.topic == settings.events_topic:
            events.append(StatusEvent.model_validate_json(r.value))
        elif r.topic.startswith(settings.topic("notify.dlq.")):
            dlq.append(DlqRecord.model_validate_json(r.value))
        else:
            retries.append(load(r.value, envelope(settings)))
    return events, dlq, retries


def flood_beside_acme(settings: Settings,
                      make: Callable[[Settings, int, int], KafkaSourceMessage],
                      count: int, **kw: Any
                      ) -> tuple[list[StatusEvent], list[DlqRecord], list[IngestRecord]]:
    """Run the P1 send flow on one worker over ``make(settings, i, offset)`` for ``i`` in
    ``range(count)``, then one bound acme ``record`` at the next offset; its ``decode``d output
    (``kw`` go to :func:`send_flow`). Offsets (and the acme message's code) start at a random
    base of their own per run."""
    from bytewax.testing import TestingSource

    base = 10**12 + uuid.uuid4().int % 10**9
    items = [make(settings, i, base + i) for i in range(count)]
    items.append(kmsg(settings, record(f"{base}-ok"), base + count))
    out: list[OutRecord] = []
    RUNNERS[next(iter(RUNNERS))](send_flow(settings, Tier.P1, TestingSource(items), out, **kw))
    return decode(settings, out)


def send_flow(settings: Settings, tier: Tier, source: Any, out: list[OutRecord],
              **kw: Any) -> Any:
    """The send flow over a testing source, with no preferences unless given."""
    from bytewax.testing import TestingSink, TestingSource

    from notiflow.flows.send.flow import build_send_flow

    kw.setdefault("preferences", TestingSource([]))
    return build_send_flow(settings, tier, source=source, sink=TestingSink(out), **kw)


class MemorySend:
    """A send flow's memory ports (``adapters/memory``): the :class:`MemoryState` a test
    seeds and inspects (template ``flow-otp`` version 1 of acme is in it), and
    :meth:`flow`, the send flow on them. The state outlives each run, as Redis and
    Cassandra do: a second run replays the first one's leases."""

    def __init__(self, settings: Settings, tier: Tier = Tier.P1, **kw: Any) -> None:
        self.settings = settings
        self.tier = tier
        self.state: MemoryState
        self.ports: OpenSendPorts
        self.state, self.ports = memory_ports(settings, tier, **kw)
        self.state.put_template("acme", "flow-otp", "SMS", "Flow test code {{ code }}")

    def flow(self, source: Any, out: list[OutRecord], *, settings: Settings | None = None,
             tier: Tier | None = None, **kw: Any) -> Any:
        ports = self.ports if tier is None else self.state.opener(tier)
        return send_flow(settings or self.settings, tier or self.tier, source, out,
                         ports=ports, **kw)

    def run(self, runner: str, items: list[Any], *, batch_size: int | None = None,
            **kw: Any) -> tuple[list[StatusEvent], list[DlqRecord], list[IngestRecord]]:
        """Run :meth:`flow` over ``items`` with ``RUNNERS[runner]``; its decoded output."""
        from bytewax.testing import TestingSource

        out: list[OutRecord] = []
        source = (TestingSource(items) if batch_size is None
                  else TestingSource(items, batch_size=batch_size))
        RUNNERS[runner](self.flow(source, out, **kw))
        return decode(kw.get("settings") or self.settings, out)


@pytest.fixture
def memory_send(settings: Settings) -> Callable[..., MemorySend]:
    """``memory_send(tier=P1, settings=..., **memory_ports kwargs)`` → a :class:`MemorySend`
    (no server needed)."""
    def make(tier: Tier = Tier.P1, settings_: Settings | None = None,
             **kw: Any) -> MemorySend:
        return MemorySend(settings_ or settings, tier, **kw)

    return make
