"""One tenant's dead letters in a real send flow on memory ports: 150 chat messages of globex
to webhook URLs no chat provider posts to are dead-lettered (``recipient_not_served``) and
charged to globex; the flow never halts, and acme's message in the same run reaches its
provider."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import orjson
import pytest
from bytewax.connectors.kafka import KafkaSourceMessage

from notiflow.flows.common.guard import charged_to_tenant
from notiflow.schemas.enums import Channel, Status, Tier
from notiflow.settings import Settings
from tests.flow.conftest import MemorySend, bound, flood_beside_acme

pytestmark = pytest.mark.flow

FLOOD = 150


def unserved_chat(settings: Settings, i: int, offset: int) -> KafkaSourceMessage:
    doc = {"channel": "CHAT", "tier": "P1", "tenant_id": "globex",
           "recipient": f"https://hooks.unserved.example/services/T0/B0/{i}",
           "template_id": "flow-chat", "template_version": 1, "variables": {"code": str(i)}}
    topic, value = settings.ingest_topic(Channel.CHAT, Tier.P1), orjson.dumps(doc)
    return KafkaSourceMessage(key=None, value=value, topic=topic,
                              headers=bound(settings, topic, value), latency=None,
                              offset=offset, partition=0,
                              timestamp=(1, int(datetime.now(UTC).timestamp() * 1000)))


def test_one_tenants_unserved_chat_urls_never_halt_the_tier(
        settings: Settings, memory_send: Callable[..., MemorySend]) -> None:
    mem = memory_send()
    mem.state.put_template("globex", "flow-chat", "CHAT", "Alert {{ code }}")
    events, dlq, _ = flood_beside_acme(settings, unserved_chat, FLOOD, ports=mem.ports)
    unserved = [d for d in dlq if d.error_class == "recipient_not_served"]
    assert len(unserved) == FLOOD
    assert all(d.tenant_id == "globex" and d.headers.get("channel") == "CHAT"
               and charged_to_tenant(d) for d in unserved)
    assert any(e.tenant_id == "acme" and e.status is Status.PROVIDER_ACCEPTED for e in events)
