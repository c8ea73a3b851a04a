"""Every Kafka topic (docs/design.md, "Topics and keys"), created idempotently."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from notiflow.adapters.kafka_io import kafka_config
from notiflow.schemas.enums import Channel, Tier
from notiflow.settings import Settings

_DAY_MS = 24 * 3600 * 1000

log = logging.getLogger("notiflow.kafka.admin")
"""Where the admin clients' librdkafka log lines go: without a ``logger`` librdkafka prints
them on stderr itself (``%3|...|FAIL|...``), in the middle of ``notiflow demo``'s screen."""


def _admin(settings: Settings) -> AdminClient:
    """An admin client whose librdkafka log lines queue up for :data:`log`; an admin client
    serves that queue only in ``poll``, which :func:`_hand_over_log` calls."""
    return AdminClient(kafka_config(settings, {"logger": log}))


def _hand_over_log(admin: AdminClient) -> None:
    admin.poll(0)


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic, each once, in either mode (the per-tier ingest topics exist in ``shared``
    mode too: a duplicate name in one CreateTopics request crashed librdkafka)."""
    tiered = settings.model_copy(update={"mode": "tiered"})
    specs = [
        TopicSpec(
            tiered.ingest_topic(channel, tier),
            settings.ingest_partitions,
            {"retention.ms": str(7 * _DAY_MS)},
        )
        for channel in Channel
        for tier in Tier
    ]
    specs.append(TopicSpec(settings.shared_topic, settings.ingest_partitions,
                           {"retention.ms": str(7 * _DAY_MS)}))
    specs += [
        TopicSpec(settings.events_topic, settings.events_partitions,
                  {"retention.ms": str(7 * _DAY_MS)}),
        TopicSpec(settings.receipts_topic, settings.events_partitions,
                  {"retention.ms": str(7 * _DAY_MS)}),
        TopicSpec(settings.delayed_topic, settings.events_partitions,
                  {"retention.ms": str(7 * _DAY_MS)}),
        TopicSpec(settings.preferences_topic, settings.events_partitions,
                  {"cleanup.policy": "compact"}),
        TopicSpec(settings.users_topic, settings.events_partitions,
                  {"cleanup.policy": "compact"}),
    ]
    specs += [
        TopicSpec(name, 1, {"retention.ms": str(30 * _DAY_MS)})
        for name in [*(settings.dlq_topic(t) for t in [*Tier, None]),
                     settings.webhooks_dlq_topic]
    ]
    assert len({s.name for s in specs}) == len(specs), "duplicate topic names"
    return specs


def ensure_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create missing topics with ``kafka_replication_factor`` replicas and
    ``kafka_min_insync_replicas``; returns the names created. Existing topics keep theirs
    (a replica count changes by partition reassignment, docs/operations.md)."""
    admin = _admin(settings)
    try:
        existing = set(admin.list_topics(timeout=timeout).topics)
        wanted = [s for s in topic_specs(settings) if s.name not in existing]
        if not wanted:
            return []
        futures = admin.create_topics(
            [NewTopic(s.name, num_partitions=s.partitions,
                      replication_factor=settings.kafka_replication_factor,
                      config={**s.config,
                              "min.insync.replicas": str(settings.kafka_min_insync_replicas)})
             for s in wanted],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        return _settled(futures, timeout, already="TOPIC_ALREADY_EXISTS")
    finally:
        _hand_over_log(admin)


def _settled(futures: dict[str, Any], timeout: float, already: str) -> list[str]:
    """Names whose admin operation succeeded; an error naming ``already`` (the topic was
    already in the wanted state) is skipped, any other raised."""
    done = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout)
            done.append(name)
        except KafkaException as exc:
            if already not in str(exc):
                raise
    return done


def delete_topics(settings: Settings, prefix: str | None = None,
                  timeout: float = 60.0) -> list[str]:
    """Delete every topic whose name starts with ``prefix`` (default: the settings' topic
    prefix, which must not be empty) and wait until the broker no longer lists them; returns
    the names deleted. Test sessions and benchmark phases each create a prefixed copy of every
    topic; a local broker that keeps them all runs out of heap when it starts (thousands of
    partitions)."""
    prefix = settings.topic_prefix if prefix is None else prefix
    if not prefix:
        raise ValueError("refusing to delete every topic: give a non-empty prefix")
    admin = _admin(settings)
    try:
        names = sorted(t for t in admin.list_topics(timeout=timeout).topics
                       if t.startswith(prefix))
        if not names:
            return []
        futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
        deleted = _settled(futures, timeout, already="UNKNOWN_TOPIC_OR_PART")
        deadline = time.monotonic() + timeout
        while set(admin.list_topics(timeout=timeout).topics) & set(names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics with prefix {prefix!r} still listed after "
                                   f"{timeout} s")
            time.sleep(0.2)
        return sorted(deleted)
    finally:
        _hand_over_log(admin)
