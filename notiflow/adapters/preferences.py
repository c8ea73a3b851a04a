"""Recipient preference and suppression state: write to Cassandra, then publish.

Cassandra ``recipient_preferences`` is the source of truth; the compacted topic
``notify.preferences`` carries every state whole (key ``{tenant_id}:{recipient_hash}``) for the
send flows' join. Every change goes through :class:`PreferenceStore`:

1. read-modify-write in Cassandra, ``version + 1`` under a lightweight transaction on the
   version (:meth:`RecipientStore.change_state`); once that returns, every ``LOCAL_QUORUM``
   reader sees the new state;
2. publish the state (``acks=all``), then read it back: when another writer stored a newer
   version meanwhile, publish that one too, so the last record of a key on the topic is never
   older than Cassandra's state once every writer has finished.

A consumer keeps, per key, the state with the highest ``version`` (records of concurrent
writers may arrive out of order). A call that changes nothing still publishes the stored
state, which repairs a topic a crashed writer left behind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from notiflow.adapters.cassandra.recipients import RecipientStore, StateContention
from notiflow.adapters.kafka_io import DeliveryFailed, OutRecord
from notiflow.adapters.outages import OUTAGE
from notiflow.schemas.enums import Category, Channel
from notiflow.schemas.messages import SCHEMA_VERSION
from notiflow.schemas.preferences import (
    OptOut,
    PreferenceState,
    PreferencesUpdate,
    Suppression,
    state_key,
)

log = logging.getLogger(__name__)

MAX_PUBLISH_ROUNDS = 5
PREFERENCE_OUTAGE: tuple[type[BaseException], ...] = (*OUTAGE, StateContention, DeliveryFailed)
"""What a preference write raises that is waited out, not a bug: a store outage, a lost race
on the recipient's state, the preference topic's broker not acknowledging."""


class RecordProducer(Protocol):
    """Anything that produces one record and returns once the broker acknowledged it
    (:class:`~notiflow.adapters.kafka_io.AsyncProducer`)."""

    async def produce(self, record: OutRecord) -> Any: ...


def state_record(topic: str, state: PreferenceState) -> OutRecord:
    """The ``notify.preferences`` record of a state (key = :func:`state_key`)."""
    return OutRecord(
        topic=topic, key=state.key.encode(), value=state.model_dump_json().encode(),
        headers=[("tenant_id", state.tenant_id.encode()),
                 ("schema_version", str(SCHEMA_VERSION).encode())],
    )


class StoredStates:
    """Read-only access to recipient states by :func:`state_key` (the expander's view)."""

    def __init__(self, store: RecipientStore) -> None:
        self.store = store

    async def get_states(self, keys: Iterable[tuple[str, str]]) -> dict[str, PreferenceState]:
        found = await self.store.get_states(keys)
        return {st.key: st for st in found.values()}


class PreferenceStore:
    """Reads and changes of recipient state; every change is written, then published."""

    def __init__(self, store: RecipientStore, producer: RecordProducer, topic: str) -> None:
        self.store = store
        self.producer = producer
        self.topic = topic

    async def get_state(self, tenant_id: str, recipient_hash: str) -> PreferenceState | None:
        """The stored state (read at ``LOCAL_QUORUM``: includes every acknowledged change)."""
        return await self.store.get_state(tenant_id, recipient_hash)

    async def get_states(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[str, PreferenceState]:
        """States of many ``(tenant_id, recipient_hash)``, by :func:`state_key`; recipients
        without a stored state are absent."""
        found = await self.store.get_states(keys)
        return {st.key: st for st in found.values()}

    async def set_preferences(self, tenant_id: str, recipient_hash: str,
                              update: PreferencesUpdate, now: datetime | None = None, *,
                              muted_topics: tuple[str, ...] | None = None
                              ) -> PreferenceState:
        """Replace timezone, quiet hours and opt-outs, and the muted topics when given
        (always a new version); the suppression is kept. Returns the state written, after
        it was published."""
        def change(st: PreferenceState) -> PreferenceState:
            mutes = st.muted_topics if muted_topics is None else muted_topics
            return st.model_copy(update={"timezone": update.timezone,
                                         "quiet_hours": update.quiet_hours,
                                         "opt_outs": update.opt_outs,
                                         "muted_topics": mutes})

        state, _ = await self.store.change_state(tenant_id, recipient_hash, change, now)
        if state is None:
            raise RuntimeError("preferences update produced no state")
        await self.publish(state)
        return state

    async def opt_out(self, tenant_id: str, recipient_hash: str, channel: Channel,
                      category: Category, now: datetime | None = None) -> PreferenceState:
        """Add an opt-out of ``category`` on ``channel`` unless one already covers it (then
        nothing is written); returns the stored state after it was published (again, when
        unchanged: a publish that failed earlier is repaired)."""
        def change(st: PreferenceState) -> PreferenceState | None:
            if any(o.matches(channel, category) for o in st.opt_outs):
                return None
            added = OptOut(channel=channel, category=category)
            return st.model_copy(update={"opt_outs": (*st.opt_outs, added)})

        state, _ = await self.store.change_state(tenant_id, recipient_hash, change, now)
        if state is None:
            raise RuntimeError("an opt-out produced no state")
        await self.publish(state)
        return state

    async def suppress(self, tenant_id: str, recipient_hash: str, reason: Suppression,
                       now: datetime | None = None) -> PreferenceState:
        """Suppress an address or device token (dead token, hard bounce, ...); returns the
        stored state after it was published."""
        state = await self.store.suppress(tenant_id, recipient_hash, reason, now)
        await self.publish(state)
        return state

    async def deactivate_token(self, tenant_id: str, token_hash: str, reason: str,
                               now: datetime | None = None, *,
                               older: Sequence[str] = ()) -> PreferenceState:
        """A push service says the token is dead: suppress it (``token_deactivated``, under
        ``token_hash``, its current hash), then mark every registered owner's row of it
        inactive with ``reason``: the owners recorded under ``token_hash`` and under each of
        its ``older`` hashes (rotated keys, the legacy hash). Returns the suppressed state; a
        failure of any write is raised (all are idempotent: the caller retries the whole
        call)."""
        state = await self.suppress(tenant_id, token_hash, "token_deactivated", now)
        for h in dict.fromkeys((token_hash, *older)):
            await self.store.deactivate_token(tenant_id, h, reason, now or state.updated_at)
        return state

    async def unsuppress(self, tenant_id: str, recipient_hash: str,
                         now: datetime | None = None, *,
                         only: Suppression | None = None) -> PreferenceState | None:
        """Clear a suppression (with ``only``, one for that reason); returns the stored
        state (None when there is none) after it was published."""
        state = await self.store.unsuppress(tenant_id, recipient_hash, now, only=only)
        if state is not None:
            await self.publish(state)
        return state

    async def publish(self, state: PreferenceState) -> None:
        """Publish ``state``, then any newer version stored meanwhile (see module doc).
        Raises :class:`~notiflow.adapters.kafka_io.DeliveryFailed` when not acknowledged."""
        current = state
        for _ in range(MAX_PUBLISH_ROUNDS):
            await self.producer.produce(state_record(self.topic, current))
            latest = await self.store.get_state(current.tenant_id, current.recipient_hash)
            if latest is None or latest.version <= current.version:
                return
            current = latest
        log.warning("state %s still changing after %d publications; the last writer "
                    "publishes the newest", state_key(state.tenant_id, state.recipient_hash),
                    MAX_PUBLISH_ROUNDS)
