"""The send dataflow of one tier (or of every tier, in the ``shared`` baseline mode).

Recipe (``build_send_flow``)::

    ingest.{sms,email,push}.{tier}        Kafka, offsets in Bytewax recovery; one consumer per
                                          worker, waiting up to poll_wait for a record; a
                                          channel whose dispatcher is full pauses its own
                                          partitions
      → parse                             bad bytes / unknown tenant → DLQ record
    notify.preferences ─┐                 compacted: consent, opt-outs, timezone, suppression
      → join by recipient                 keyed state, warm after a restart
      → policy                            opted out / suppressed → SUPPRESSED;
                                          quiet hours (P2/P3) → deferred to the window's end
      → hold (keyed by message_id)        retry backoff, scheduled_at, quiet hours: timers
      → send (keyed by channel+shard)     asynchronous: dedup lease, expiry, recipient and
                                          tenant caps (Redis; over a cap → SUPPRESSED),
                                          content dedup, marketing consent re-checked in
                                          Cassandra, render, capacity token, provider call;
                                          bounded per channel
      → dlq-guard                         too many dead letters → the flow halts (guard.py)
      → encode → confirming Kafka sink    notify.events, retry records, notify.dlq.{tier}

Every outcome is data: a status event, a retry record produced back to the ingest topic
(held until due), or a DLQ record. Progress is committed only after the sink confirmed every
record; messages in flight at an epoch's end are part of the snapshot.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow
from bytewax.inputs import Source
from bytewax.outputs import Sink
from pydantic import ValidationError

from notiflow.adapters.bytewax_kafka import (
    ConfirmingSink,
    PausableKafkaSource,
    kafka_source,
)
from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.adapters.kafka_io import OutRecord
from notiflow.adapters.ports import OpenSendPorts
from notiflow.adapters.send_ports import opener, sender_identity
from notiflow.flows.consent import PolicyStep, PreferenceJoin, join_key
from notiflow.flows.dispatch import ChannelPressure, Dispatcher, SendLogic, shard_key
from notiflow.flows.guard import DlqGuard
from notiflow.flows.model import Work, is_work, utcnow
from notiflow.flows.steps import Clock, Encoder, Hold, IngestParser, RawMessage
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.preferences import PreferenceState
from notiflow.settings import Settings

SHARDS_PER_CHANNEL = 8


def parse_preference(msg: RawMessage) -> PreferenceState | None:
    """A ``notify.preferences`` record → state; tombstones and bad records are skipped (the
    API is the only writer, and Cassandra stays the source of truth)."""
    value = getattr(msg, "value", None)
    if not value:
        return None
    try:
        return PreferenceState.model_validate_json(value)
    except ValidationError:
        return None


def build_send_flow(
    settings: Settings,
    tier: Tier | None,
    *,
    source: Source[Any] | None = None,
    preferences: Source[Any] | None = None,
    sink: Sink[OutRecord] | None = None,
    ports: OpenSendPorts | None = None,
    clock: Clock = utcnow,
    rng: random.Random | None = None,
    workers: int = 1,
) -> Dataflow:
    """The send dataflow of ``tier`` (``None`` = the shared baseline over every tier);
    ``source``/``preferences``/``sink`` default to Kafka and ``ports`` to the real stores and
    providers, opened when the flow runs; ``workers`` = processes of this flow (sizes the
    local limits used while Redis is down). Building opens nothing."""
    cipher = DlqCipher.from_settings(settings)
    shared = tier is None
    policy_tier = Tier.P2 if shared else tier
    assert policy_tier is not None
    policy = settings.policy(policy_tier)
    name = "shared" if shared else policy_tier.value.lower()
    pressure = ChannelPressure(policy.max_queued + policy.max_in_flight)
    topics = ([settings.shared_topic] if shared
              else [settings.ingest_topic(c, policy_tier) for c in Channel])
    channel_of = {settings.topic(f"ingest.{c.value.lower()}.{name}"): c for c in Channel}
    flow = Dataflow(f"send-{name}")

    ingest = source or PausableKafkaSource(
        kafka_source(settings, topics, policy.batch_size, wait=policy.poll_wait),
        lambda topic: topic in channel_of and pressure.paused(channel_of[topic]))
    raw = op.input("ingest", flow, ingest)
    parsed = op.map("parse", raw, IngestParser(settings, tier, cipher, clock))
    split = op.branch("is-work", parsed, is_work)

    # never waits (the ingest source's wait is the worker's) and never sleeps: the stateful
    # steps process an epoch once every input's frontier has reached it
    prefs_raw = op.input("preferences", flow, preferences or kafka_source(
        settings, [settings.preferences_topic], 1000, wait=timedelta(0)))
    prefs = op.filter_map("parse-preferences", prefs_raw, parse_preference)
    joined = op.stateful("join-preferences",
                         op.key_on("by-recipient", op.merge("messages+prefs", split.trues, prefs),
                                   join_key),
                         PreferenceJoin)
    decided = op.flat_map("policy", op.key_rm("unkey-recipient", joined),
                          PolicyStep(settings, clock))
    decision = op.branch("to-send", decided, is_work)

    def due_now(w: Work) -> bool:
        return w.is_due(clock())

    timing = op.branch("due-now", decision.trues, due_now)
    held = op.stateful("hold", op.key_on("by-message", timing.falses, lambda w: w.message_id),
                       lambda resume: Hold(resume, clock))
    ready = op.merge("ready", timing.trues, op.key_rm("unkey-message", held))

    owner = sender_identity()
    dispatcher = Dispatcher(settings, policy_tier, policy, cipher, pressure, clock,
                            ports or opener(settings, policy_tier, owner, workers), owner, rng,
                            source=f"send.{name}", workers=workers)
    sent = op.key_rm("unkey-send", op.stateful_batch(
        "send", op.key_on("by-channel-shard", ready,
                          lambda w: shard_key(w, SHARDS_PER_CHANNEL)),
        lambda resume: SendLogic(dispatcher, resume)))

    outputs = op.merge("outputs", sent, split.falses, decision.falses)
    guarded = op.map("dlq-guard", outputs, DlqGuard(settings.dlq, f"send.{name}"))
    records = op.map("encode", guarded, Encoder(settings))
    op.output("kafka-out", records, sink or ConfirmingSink(settings, policy_tier.value))
    return flow
