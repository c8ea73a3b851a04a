"""The reconciler's apply step alone: CPU per message of ``ApplyStep`` (this process) and of
Cassandra, for new direct-producer messages first seen as PROVIDER_ACCEPTED (eight rows each)
and then for their DELIVERED receipts (correlated by the signed message id hint).

``python -m notiflow.bench.reconcile_apply [N] [ROUNDS] [BATCH]`` needs the local stack up
(``notiflow stack up``) and ``NOTIFLOW_DLQ_KEY`` set; it applies N messages per round in
batches of BATCH (default 5,000, 4 rounds, 1,000) and prints one line per round and kind.
The models are built before the clock starts, so the figures are the step's own. The first
round warms the JVM and the driver: quote the later ones. Cassandra's figure includes its
background work (flushes, compaction) and varies from round to round.
"""

from __future__ import annotations

import sys
import time
import uuid
from datetime import UTC, datetime

import psutil

from notiflow.adapters.dlq_crypto import DlqCipher
from notiflow.bench.cassandra_requests import cassandra_process
from notiflow.flows.common.items import ReconcileIn, SourcedReceipt, SourceRef
from notiflow.flows.receipts.reconcile import ApplyStep
from notiflow.schemas.enums import Status
from notiflow.schemas.messages import Receipt, StatusEvent
from notiflow.settings import Settings


def accepted(message_id: str, sid: str, at: datetime) -> StatusEvent:
    """The send flow's PROVIDER_ACCEPTED event of a direct-producer message (with its
    snapshot and attempt detail)."""
    when = at.isoformat()
    return StatusEvent.model_validate({
        "event_id": f"{message_id}:PROVIDER_ACCEPTED:1", "message_id": message_id,
        "tenant_id": "acme", "channel": "SMS", "tier": "P2", "status": "PROVIDER_ACCEPTED",
        "attempt": 1, "occurred_at": when, "source": "send.p2",
        "message": {"tenant_id": "acme", "channel": "SMS", "tier": "P2",
                    "category": "account", "template_id": "bench", "template_version": 1,
                    "recipient_hash": "h" * 32, "recipient_masked": "+1415*****71",
                    "accepted_at": when},
        "attempt_detail": {"attempt_no": 1, "provider_id": "twilio", "outcome": "accepted",
                           "provider_message_id": sid, "started_at": when,
                           "completed_at": when}})


def delivered(message_id: str, sid: str, at: datetime) -> SourcedReceipt:
    receipt = Receipt(provider_id="twilio", provider_event_id=f"{sid}:delivered",
                      provider_message_id=sid, status=Status.DELIVERED, occurred_at=at,
                      raw_status="delivered", message_id=message_id, attempt=1)
    return SourcedReceipt(receipt, SourceRef("bench.receipts", 0, 0), b"{}")


def main(n: int, rounds: int, size: int) -> None:
    settings = Settings()
    step = ApplyStep(settings, DlqCipher.from_settings(settings))
    cassandra, me = cassandra_process(), psutil.Process()
    print(f"{n} messages per round, batches of {size}")
    for r in range(rounds):
        at = datetime.now(UTC)
        ids = [(f"bench-ra-{uuid.uuid4().hex}", f"SM{uuid.uuid4().hex}") for _ in range(n)]
        for kind, make in (("events", accepted), ("receipts", delivered)):
            batches: list[list[ReconcileIn]] = [
                [make(m, sid, at) for m, sid in ids[i:i + size]] for i in range(0, n, size)]
            c0, k0, t0 = me.cpu_times(), cassandra.cpu_times(), time.monotonic()
            for batch in batches:
                if out := step(batch):
                    raise SystemExit(f"unexpected outputs: {out[:1]}")
            c1, k1, t1 = me.cpu_times(), cassandra.cpu_times(), time.monotonic()
            own = (c1.user + c1.system - c0.user - c0.system) * 1000 / n
            cass = (k1.user + k1.system - k0.user - k0.system) * 1000 / n
            print(f"round {r + 1} {kind}: apply {own:.3f} ms/msg, Cassandra {cass:.3f} ms/msg, "
                  f"{n / (t1 - t0):,.0f} msg/s", flush=True)


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:4]]
    main(*(args + [5000, 4, 1000][len(args):]))
