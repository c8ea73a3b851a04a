"""Composite steps every notiflow dataflow is built from.

- :func:`parse_or_dlq`: raw records → the parsed stream and the rest (DLQ records: errors
  are data);
- :func:`hold_until_due`: items not due yet wait in recoverable state, released when due;
- :func:`guard_and_emit`: the DLQ guard, the encoder and the confirming sink, in that order.

They add ordinary Bytewax steps to the flow under the ids given, so a flow that adopts them
keeps the ids (and the recovery state) of its stateful steps.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeGuard, TypeVar

import bytewax.operators as op
from bytewax.dataflow import Stream
from bytewax.outputs import Sink

from notiflow.adapters.kafka_io import OutRecord
from notiflow.flows.common.guard import DlqGuard
from notiflow.flows.common.steps import Clock, Hold

X = TypeVar("X")
Y = TypeVar("Y")


def parse_or_dlq(step_id: str, up: Stream[Any], parse: Callable[[Any], object],
                 ok: type[X] | tuple[type[Any], ...], *, guard: DlqGuard | None = None
                 ) -> tuple[Stream[X], Stream[Any]]:
    """``parse`` every record (step ``step_id``): what is an ``ok`` goes on (first stream);
    the rest (a :class:`DlqRecord` for bad bytes, an unknown tenant or a schema error, or an
    outcome decided at parse time) goes to the flow's outputs and never stops the flow.
    ``guard`` counts the parse outcomes (for a flow whose other outputs need no guard)."""
    parsed = op.map(step_id, up, parse)
    if guard is not None:
        parsed = op.map("dlq-guard", parsed, guard)
    return split_by_type(f"{step_id}-ok", parsed, ok)


def split_by_type(step_id: str, up: Stream[Any], ok: type[X] | tuple[type[Any], ...]
                  ) -> tuple[Stream[X], Stream[Any]]:
    """The items that are an ``ok`` (one type, or any of several), and the others."""
    def is_ok(item: object) -> TypeGuard[X]:
        return isinstance(item, ok)

    split = op.branch(step_id, up, is_ok)
    return split.trues, split.falses


def hold_until_due(step_id: str, up: Stream[X], *, key: Callable[[X], str], clock: Clock,
                   due_of: Callable[[X], datetime | None]) -> Stream[X]:
    """Items due now pass at once; the others wait in the keyed state of step ``step_id``
    (:class:`~notiflow.flows.common.steps.Hold`, snapshotted each epoch) until ``due_of`` passes."""
    def due_now(item: X) -> bool:
        at = due_of(item)
        return at is None or at <= clock()

    timing = op.branch(f"{step_id}-due-now", up, due_now)
    held = op.stateful(step_id, op.key_on(f"{step_id}-key", timing.falses, key),
                       lambda resume: Hold(resume, clock, due_of=due_of))
    return op.merge(f"{step_id}-ready", timing.trues, op.key_rm(f"{step_id}-unkey", held))


def guard_and_emit(up: Stream[Y], *, guard: DlqGuard | None, encode: Callable[[Y], OutRecord],
                   sink: Sink[OutRecord]) -> None:
    """Every output of a flow: counted by ``guard`` (too many dead letters stop the flow),
    encoded, and produced by ``sink`` (progress commits only once Kafka confirmed it)."""
    guarded = op.map("dlq-guard", up, guard) if guard is not None else up
    op.output("kafka-out", op.map("encode", guarded, encode), sink)
