"""A Bytewax flow that never receives a record (its one source partition is always empty),
for tests that run a real worker in a subprocess: ``python -m bytewax.run
tests.idle_flow:flow``, or :func:`build` from a script (the repository on ``PYTHONPATH``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import bytewax.operators as op
from bytewax.connectors.stdio import StdOutSink
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition


class Idle(StatefulSourcePartition[None, None]):
    def next_batch(self) -> list[None]:
        return []

    def next_awake(self) -> datetime:
        return datetime.now(UTC) + timedelta(milliseconds=100)

    def snapshot(self) -> None:
        return None


class Nothing(FixedPartitionedSource[None, None]):
    def list_parts(self) -> list[str]:
        return ["only"]

    def build_part(self, step_id: str, for_part: str, resume_state: None) -> Idle:
        return Idle()


def build() -> Dataflow:
    flow = Dataflow("idle")
    op.output("out", op.input("in", flow, Nothing()), StdOutSink())
    return flow


flow = build()
