"""Ingest binding in a real send flow on memory ports, required mode (the test
environment's): 150 records a rogue producer writes in globex's name — unsigned, or signed
with acme's key — are dead-lettered as ``tenant_claim_refused``, charged to the producer and
never to globex; the flow never halts, and acme's bound message in the same run reaches its
provider."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from bytewax.connectors.kafka import KafkaSourceMessage

from notiflow.flows.common.guard import source_of
from notiflow.ingest_binding import binder, tenant_signer
from notiflow.schemas.enums import Status, Tier
from notiflow.settings import Settings
from tests.flow.conftest import MemorySend, flood_beside_acme, record

pytestmark = pytest.mark.flow

FLOOD = 150


def forged(settings: Settings, i: int, offset: int) -> KafkaSourceMessage[bytes, bytes]:
    topic = settings.ingest_topic("SMS", Tier.P1)
    value = record(f"forged-{i}", tenant_id="globex")
    acme = tenant_signer(settings, "acme")
    assert acme is not None
    headers = [("producer", b"rogue")]
    if i % 2:
        headers.append(acme.header("SMS", "P1", value))
    return KafkaSourceMessage(key=None, value=value, topic=topic, headers=headers,
                              latency=None, offset=offset, partition=0,
                              timestamp=(1, int(datetime.now(UTC).timestamp() * 1000)))


def test_forged_tenant_claims_are_dead_lettered_to_their_producer(
        settings: Settings, memory_send: Callable[..., MemorySend]) -> None:
    assert binder(settings).required
    events, dlq, _ = flood_beside_acme(settings, forged, FLOOD, ports=memory_send().ports)
    refused = [d for d in dlq if d.error_class == "tenant_claim_refused"]
    assert len(refused) == FLOOD
    assert {source_of(d) for d in refused} == {"producer:rogue"}
    assert sum("tenant 'acme'" in d.reason for d in refused) == FLOOD // 2
    assert not any(e.tenant_id == "globex" for e in events)
    assert any(e.tenant_id == "acme" and e.status is Status.PROVIDER_ACCEPTED for e in events)
