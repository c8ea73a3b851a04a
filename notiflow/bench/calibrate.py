"""How fast this machine runs Python right now: a fixed single-threaded workload (a send
record's JSON encode and decode, a SHA-256 of it, a few string and dict operations) timed for
about a second, in rounds of the workload per second.

The same code measured 1.5 and 2.7 ms of CPU per P3 message in two consecutive runs on one
virtual machine (docs/decisions/2026-12-03-benchmark-protocol.md): a benchmark that records
the machine's speed
before and after its load tells a slow moment of the machine apart from slower code.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

_RECORD: dict[str, Any] = {
    "message_id": "msg_0123456789abcdef", "tenant_id": "acme", "tier": "P3", "channel": "SMS",
    "recipient": {"phone": "+14155550100", "locale": "en-US"},
    "template": {"id": "promo", "version": 3},
    "variables": {"name": "Ada", "code": "123456", "items": list(range(12))},
    "accepted_at": "2026-12-02T05:00:00.000000+00:00",
}


def one_round() -> int:
    """The workload once; returns a value derived from every step (so none is skipped)."""
    text = json.dumps(_RECORD, sort_keys=True)
    back = json.loads(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    keys = sorted(k.upper() for k in back)
    return len(digest) + len(keys) + sum(back["variables"]["items"])


def speed(seconds: float = 1.0) -> dict[str, float]:
    """Rounds of :func:`one_round` per second of wall time and per second of this thread's
    CPU, over about ``seconds`` (a wall rate well under the CPU rate: the core was busy)."""
    rounds = 0
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    while (elapsed := time.perf_counter() - wall0) < seconds:
        for _ in range(100):
            one_round()
        rounds += 100
    cpu = max(time.thread_time() - cpu0, 1e-9)
    return {"rounds": rounds, "per_wall_s": round(rounds / elapsed),
            "per_cpu_s": round(rounds / cpu)}
