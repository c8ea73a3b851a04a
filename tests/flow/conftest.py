"""Flow tests run real dataflows in-process: close each worker's clients after every test."""

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


@pytest.fixture(scope="module")
def template(stack: Settings) -> int:
    """Template ``flow-otp`` version 1 for tenant acme, written straight to Cassandra."""
    return put_template(stack, "acme", "flow-otp", "SMS", "Flow test code {{ code }}")


def put_template(stack: Settings, tenant: str, template_id: str, channel: str, body: str,
                 subject: str | None = None) -> int:
    """Write version 1 of a template straight to Cassandra; returns the version."""
    from notiflow.adapters.cassandra.session import connect
    from notiflow.adapters.cassandra.store import CassandraStore
    from notiflow.adapters.cassandra.templates import TemplateRow
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
                      count: int) -> tuple[list[StatusEvent], list[DlqRecord], list[IngestRecord]]:
    """Run the P1 send flow on one worker over ``make(settings, i, offset)`` for ``i`` in
    ``range(count)``, then one bound acme ``record`` at the next offset; its ``decode``d output.
    Offsets (and the acme message's code) start at a random base of their own per run."""
    from bytewax.testing import TestingSource

    base = 10**12 + uuid.uuid4().int % 10**9
    items = [make(settings, i, base + i) for i in range(count)]
    items.append(kmsg(settings, record(f"{base}-ok"), base + count))
    out: list[OutRecord] = []
    RUNNERS[next(iter(RUNNERS))](send_flow(settings, Tier.P1, TestingSource(items), out))
    return decode(settings, out)


def send_flow(settings: Settings, tier: Tier, source: Any, out: list[OutRecord],
              **kw: Any) -> Any:
    """The send flow over a testing source, with no preferences unless given."""
    from bytewax.testing import TestingSink, TestingSource

    from notiflow.flows.send import build_send_flow

    kw.setdefault("preferences", TestingSource([]))
    return build_send_flow(settings, tier, source=source, sink=TestingSink(out), **kw)
