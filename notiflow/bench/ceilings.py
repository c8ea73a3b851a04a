"""The two ceilings ``notiflow bench throughput`` measures next to the platform, each run as its
own process on the same topics and partitions:

(a) **minimal pipeline**: a plain consumer that does only what every message needs: one
    provider request to the emulator (the platform's own provider adapters: same HTTP, SMTP
    and HTTP/2 clients, to the provider the tier's routing policy ranks first) and one status
    write to Cassandra (the same driver), a Kafka batch at a time with the tier's batch size
    and in-flight bound, then a synchronous offset commit. No parsing beyond JSON, no
    templates, dedup, limits, breakers or events.
(b) **passthrough**: confluent-kafka consume → produce (acks=all, idempotent), nothing else.

Each prints one JSON line: messages, seconds from the first consumed message to the last
confirmed write, and the process's CPU seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from notiflow.adapters.cassandra.session import aio, connect
from notiflow.adapters.kafka_io import kafka_config, producer_config
from notiflow.adapters.providers import open_providers
from notiflow.adapters.providers.base import OutboundMessage, ProviderClient
from notiflow.flows.send.routing import rank_routes
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.messages import PushRecipient
from notiflow.settings import Settings


def _consumer(settings: Settings, topics: list[str]) -> Consumer:
    consumer = Consumer(kafka_config(settings, {
        "group.id": f"bench-{uuid.uuid4().hex}", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "fetch.wait.max.ms": 10,
        "queued.max.messages.kbytes": 8192}))
    consumer.subscribe(topics)
    return consumer


def _pick(settings: Settings, tier: Tier, out: OutboundMessage) -> str:
    """The provider the platform's router ranks first for this message with every provider
    healthy (the same policy ranking; no breakers, weights or failover)."""
    ranked = rank_routes(settings.routes, tier=tier, channel=out.channel,
                         recipient=out.recipient, enabled=settings.enabled_providers(),
                         prefixes=settings.webhook_prefixes())
    return ranked[0].provider_id


def _outbound(doc: dict[str, Any]) -> OutboundMessage:
    channel = Channel(doc["channel"])
    recipient: str | PushRecipient = doc["recipient"]
    if channel is Channel.PUSH:
        recipient = PushRecipient.model_validate(doc["recipient"])
    v = doc.get("variables", {})
    body = f"{v.get('brand', '')}: {v.get('headline', '')} {v.get('code', '')}"
    return OutboundMessage(doc["message_id"], 1, doc["tenant_id"], channel, Tier(doc["tier"]),
                           recipient, body, subject="notiflow bench")


async def minimal(settings: Settings, tier: Tier, n: int) -> dict[str, Any]:
    policy = settings.policy(tier)
    topics = [settings.ingest_topic(c, tier) for c in Channel]
    clients: dict[str, ProviderClient] = await open_providers(
        settings, sorted(settings.enabled_providers()), timeout=policy.provider_timeout)
    cluster, session = await asyncio.to_thread(connect, settings)
    stmt = session.prepare("UPDATE messages SET status = ?, updated_at = ? WHERE message_id = ?")
    consumer = _consumer(settings, topics)
    sem = asyncio.Semaphore(policy.max_in_flight)
    outcomes: dict[str, int] = {}

    async def one(value: bytes) -> None:
        out = _outbound(orjson.loads(value))
        client = clients[_pick(settings, tier, out)]
        async with sem:
            result = await client.send(out)
        outcomes[result.outcome.value] = outcomes.get(result.outcome.value, 0) + 1
        status = "PROVIDER_ACCEPTED" if result.outcome.value == "accepted" else "FAILED"
        await aio(session.execute_async(stmt, (status, datetime.now(UTC), out.message_id)))

    done = 0
    first = last = 0.0
    cpu0 = time.process_time()
    try:
        while done < n:
            msgs = await asyncio.to_thread(consumer.consume, policy.batch_size, 0.5)
            msgs = [m for m in msgs if m.error() is None]
            if not msgs:
                continue
            first = first or time.time()
            values = [v for v in (m.value() for m in msgs) if v is not None]
            await asyncio.gather(*(one(v) for v in values))
            await asyncio.to_thread(consumer.commit, asynchronous=False)
            done += len(msgs)
            last = time.time()
    finally:
        consumer.close()
        for c in clients.values():
            await c.aclose()
        cluster.shutdown()
    return {"n": done, "seconds": last - first, "cpu_s": time.process_time() - cpu0,
            "outcomes": outcomes}


def passthrough(settings: Settings, tier: Tier, n: int) -> dict[str, Any]:
    policy = settings.policy(tier)
    topics = [settings.ingest_topic(c, tier) for c in Channel]
    target = settings.topic("bench.passthrough")
    admin = AdminClient(kafka_config(settings))
    for fut in admin.create_topics([NewTopic(target, settings.ingest_partitions, 1)]).values():
        fut.result(30)
    consumer = _consumer(settings, topics)
    producer = Producer(producer_config(settings))
    failed = 0

    def confirm(err: Any, _msg: Any) -> None:
        nonlocal failed
        if err is not None:
            failed += 1

    done = 0
    first = 0.0
    cpu0 = time.process_time()
    try:
        while done < n:
            msgs = [m for m in consumer.consume(policy.batch_size, 0.5) if m.error() is None]
            if not msgs:
                continue
            first = first or time.time()
            for m in msgs:
                while True:
                    try:
                        producer.produce(target, m.value(), key=m.key(), on_delivery=confirm)
                        break
                    except BufferError:
                        producer.poll(0.01)
            producer.poll(0)
            if producer.flush(30):
                raise RuntimeError("passthrough: produce not confirmed")
            consumer.commit(asynchronous=False)
            done += len(msgs)
    finally:
        consumer.close()
    if failed:
        raise RuntimeError(f"passthrough: {failed} deliveries failed")
    return {"n": done, "seconds": time.time() - first, "cpu_s": time.process_time() - cpu0}


def main(kind: str, tier: Tier, n: int) -> None:
    settings = Settings()
    result = (asyncio.run(minimal(settings, tier, n)) if kind == "minimal"
              else passthrough(settings, tier, n))
    print("BENCH-RESULT " + json.dumps(result), flush=True)
