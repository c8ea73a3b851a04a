"""The send dataflow of one tier (or of every tier, in the ``shared`` baseline mode).

Recipe (``build_send_flow``)::

    ingest.{channel}.{tier}               Kafka, offsets in Bytewax recovery; one consumer per
                                          worker, waiting up to poll_wait for a record; a
                                          channel whose dispatcher is full pauses its own
                                          partitions
      → parse (parse_or_dlq)              bad bytes / unknown tenant → DLQ record
    notify.preferences ─┐                 compacted: consent, opt-outs, timezone, suppression
      → join by recipient                 keyed state, warm after a restart; one probe per
                                          recipient hash (key rotation), parts gathered
      → policy                            consent: opted out / suppressed → SUPPRESSED;
                                          quiet hours (P2/P3) → deferred to the window's end
      → hold (hold_until_due)             retry backoff, scheduled_at, quiet hours: timers
      → send (keyed by channel+shard)     the send step, asynchronous and bounded per
                                          channel: the stages of :func:`send_stages`
      → guard_and_emit                    too many dead letters → the flow halts (guard.py);
                                          encode → confirming Kafka sink: notify.events,
                                          retry records, notify.dlq.{tier}

The send step (``flows/send/stages/``), per batch: crash loop, unknown checks, lease, already
final, expiry, caps, content dedup, strong consent, render, routable; then per message:
quota (route: breaker admission and capacity token); inside the channel's in-flight slot,
confirm (the lease still ours and the message not cancelled: ``adapters/cancel_gate.py``),
call (the provider), last resort (a forced P0 send that failed waits), classify (what the
answer means). Each end is emitted through the attempt's lease (``sending/emit.py``).

Every outcome is data: a status event, a retry record produced back to the ingest topic
(held until due), or a DLQ record. Progress is committed only after the sink confirmed every
record; messages in flight at an epoch's end are part of the snapshot. Building the flow
opens nothing: the ports open when it runs.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import bytewax.operators as op
from bytewax.dataflow import Dataflow, Stream
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
from notiflow.flows.common.guard import DlqGuard
from notiflow.flows.common.items import Out, Work, utcnow
from notiflow.flows.common.steps import Clock, Encoder, IngestParser, RawMessage, scaled_lease_ttl
from notiflow.flows.common.toolbox import (
    guard_and_emit,
    hold_until_due,
    parse_or_dlq,
    split_by_type,
)
from notiflow.flows.send.consent import PolicyStep, join_preferences
from notiflow.flows.send.dispatch import ChannelPressure, Dispatcher, SendLogic, send_key
from notiflow.flows.send.ordering import Skip, number_ordered
from notiflow.flows.send.stages import SendStages
from notiflow.flows.send.stages.admit import AlreadyFinal, CrashLoop, Lease, UnknownChecks
from notiflow.flows.send.stages.call import Call
from notiflow.flows.send.stages.classifying import Classify
from notiflow.flows.send.stages.confirm import Confirm
from notiflow.flows.send.stages.gates import Caps, ContentDedup, Expiry, StrongConsent
from notiflow.flows.send.stages.render import Render
from notiflow.flows.send.stages.route import LastResort, Quota, Routable
from notiflow.schemas.enums import Channel, Tier
from notiflow.schemas.preferences import PreferenceState
from notiflow.settings import Settings

SHARDS_PER_CHANNEL = 8


def send_stages() -> SendStages:
    """The send step, in order: a batch is prepared stage by stage (each decides some
    messages and passes the rest on), then every prepared message goes through the
    per-message stages by itself, until one ends it."""
    return SendStages(
        prepare=(
            CrashLoop(),       # crashed the flow dlq.max_crashes times → DLQ
            UnknownChecks(),   # check record of an ambiguous attempt → FAILED or nothing
            Lease(),           # the attempt's lease: replay, wait for a live owner, take over
            AlreadyFinal(),    # an old record whose message already ended → nothing
            Expiry(),          # past expires_at → EXPIRED
            Caps(),            # recipient and tenant caps → SUPPRESSED
            ContentDedup(),    # same content to the same recipient → SUPPRESSED
            StrongConsent(),   # marketing opt-out in Cassandra → SUPPRESSED
            Render(),          # template + variables → message; FAILED or DLQ
            Routable(),        # no provider account for the channel → DLQ
        ),
        route=(
            Quota(),           # breaker admission and a capacity token → or waits / EXPIRED
        ),
        send=(                 # inside the channel's in-flight slot
            Confirm(),         # lease still ours, message not cancelled → or CANCELLED / none
            Call(),            # the provider call, timed and told to the breakers
            LastResort(),      # a forced P0 send that failed transiently → waits, same attempt
            Classify(),        # accepted, failed, unknown, retry; emitted on the lease
        ),
    )


def message_id_of(item: Work | Skip) -> str:
    return item.work.message_id if isinstance(item, Skip) else item.message_id


def due_at_of(item: Work | Skip) -> datetime | None:
    """When a message may be attempted; a :class:`Skip` goes on at once."""
    return None if isinstance(item, Skip) else item.due_at


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
    parsed, unparsed = parse_or_dlq("parse", raw, IngestParser(settings, tier, cipher, clock),
                                    Work)
    works = number_ordered("sequence", parsed, clock=clock,
                           idle=scaled_lease_ttl(settings, policy_tier))

    # never waits (the ingest source's wait is the worker's) and never sleeps: the stateful
    # steps process an epoch once every input's frontier has reached it
    prefs_raw = op.input("preferences", flow, preferences or kafka_source(
        settings, [settings.preferences_topic], 1000, wait=timedelta(0)))
    prefs = op.filter_map("parse-preferences", prefs_raw, parse_preference)
    decided = op.flat_map("policy", join_preferences(works, prefs),
                          PolicyStep(settings, clock))
    to_send: Stream[Work | Skip]
    to_send, decided_here = split_by_type("to-send", decided, (Work, Skip))
    ready = hold_until_due("hold", to_send, key=message_id_of, clock=clock, due_of=due_at_of)

    owner = sender_identity()
    dispatcher = Dispatcher(settings, policy_tier, policy, cipher, pressure, clock,
                            ports or opener(settings, policy_tier, owner, workers), owner,
                            send_stages(), rng, source=f"send.{name}", workers=workers)
    idle = scaled_lease_ttl(settings, policy_tier)
    sent = op.key_rm("unkey-send", op.stateful_batch(
        "send", op.key_on("by-send-key", ready, lambda w: send_key(w, SHARDS_PER_CHANNEL)),
        lambda resume: SendLogic(dispatcher, resume, idle=idle)))

    outputs: Stream[Out] = op.merge("outputs", sent, unparsed, decided_here)
    guard_and_emit(outputs, guard=DlqGuard(settings.dlq, f"send.{name}"),
                   encode=Encoder(settings, clock), sink=sink or ConfirmingSink(settings,
                                                                          policy_tier.value))
    return flow
