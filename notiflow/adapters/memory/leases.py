"""Send leases, cancel gates, content claims and crash counts in memory: the
:class:`~notiflow.adapters.ports.Leases` port with the semantics of ``redis_dedup.py`` and
the cancel gate's reference model (``cancel_gate.GateModel``).

One :class:`LeaseTable` holds the keys every sender of the process shares (as one Redis
does); each opened port set is a :class:`MemoryLeases` of its own ``owner`` over it. Values
are those Redis holds (``pending:{owner}:{ms}``, ``done:{json}``, ``cancelled``,
``sending``, a message id); every key with a TTL expires on the injected clock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta

import orjson

from notiflow.adapters.cancel_gate import GateModel, campaign_gate_key
from notiflow.adapters.cancel_gate import gate_key as cancel_gate_key
from notiflow.adapters.memory.clock import Clock, epoch_ms
from notiflow.adapters.ports import Confirm, LeaseState
from notiflow.correlation import CorrelationKeys


def _ms(d: timedelta) -> int:
    return max(1, int(d.total_seconds() * 1000))


class LeaseTable:
    """The shared keys: the gate model's mapping plus an expiry (epoch ms) per key, and
    crash counts per flow. Every method runs under one lock (several event loops of one
    process may call it)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.model = GateModel()
        self.expires: dict[str, int] = {}
        self.crash_counts: dict[str, dict[str, int]] = {}
        self.crash_expires: dict[str, int] = {}
        self.lock = threading.Lock()

    @property
    def kv(self) -> dict[str, str]:
        return self.model.kv

    def now_ms(self) -> int:
        return epoch_ms(self.clock)

    def get(self, key: str) -> str | None:
        """The live value of ``key`` (an expired key is dropped first)."""
        at = self.expires.get(key)
        if at is not None and at <= self.now_ms():
            self.kv.pop(key, None)
            del self.expires[key]
        return self.kv.get(key)

    def put(self, key: str, value: str, ttl: timedelta | None) -> None:
        self.kv[key] = value
        if ttl is None:
            self.expires.pop(key, None)
        else:
            self.expires[key] = self.now_ms() + _ms(ttl)

    def delete(self, key: str) -> None:
        self.kv.pop(key, None)
        self.expires.pop(key, None)

    def cancel(self, gate: str, hold: timedelta) -> bool:
        """The API's cancel of a gate (``cancel_gate.CANCEL``), kept for ``hold``."""
        with self.lock:
            self.get(gate)
            if not self.model.cancel(gate):
                return False
            self.expires[gate] = self.now_ms() + _ms(hold)
            return True

    def crashes(self, flow: str) -> dict[str, int]:
        at = self.crash_expires.get(flow)
        if at is not None and at <= self.now_ms():
            self.crash_counts.pop(flow, None)
            del self.crash_expires[flow]
        return self.crash_counts.setdefault(flow, {})


class MemoryLeases:
    """:class:`~notiflow.adapters.ports.Leases` of sender ``owner`` over a shared
    :class:`LeaseTable`; key names are those of ``redis_dedup.DedupStore``."""

    def __init__(self, table: LeaseTable, owner: str, namespace: str,
                 keys: CorrelationKeys) -> None:
        self.table = table
        self._owner = owner
        self.ns = namespace
        self.keys = keys

    @property
    def owner(self) -> str:
        return self._owner

    def lease_key(self, message_id: str, attempt: int) -> str:
        return f"{self.ns}lease:{message_id}:{attempt}"

    def gate_key(self, message_id: str) -> str:
        return cancel_gate_key(self.ns, message_id)

    def content_key(self, tenant_id: str, fingerprint: str) -> str:
        return f"{self.ns}content:{tenant_id}:{fingerprint}"

    def campaign_gate_key(self, message_id: str) -> str | None:
        return campaign_gate_key(self.ns, message_id, self.keys)

    @property
    def pending_prefix(self) -> str:
        return f"pending:{self._owner}:"

    def pending_value(self) -> str:
        return f"{self.pending_prefix}{self.table.now_ms()}"

    async def acquire(self, keys: list[str], ttl: timedelta) -> list[LeaseState]:
        """``SET NX GET`` of a pending value per key."""
        t = self.table
        with t.lock:
            out = []
            for k in keys:
                prev = t.get(k)
                if prev is None:
                    t.put(k, self.pending_value(), ttl)
                    out.append(LeaseState(True))
                else:
                    out.append(LeaseState(False, prev))
            return out

    async def take_over(self, key: str, stale: str, ttl: timedelta) -> bool:
        t = self.table
        with t.lock:
            if t.get(key) != stale:
                return False
            t.put(key, self.pending_value(), ttl)
            return True

    async def confirm(self, key: str, gate: str, ttl: timedelta,
                      campaign: str | None = None) -> Confirm:
        """``GateModel.confirm``; on OURS the lease and the gate live ``ttl`` from now."""
        t = self.table
        with t.lock:
            for k in (key, gate, campaign):
                if k is not None:
                    t.get(k)
            answer = t.model.confirm(key, gate, self.pending_prefix, self.pending_value(),
                                     campaign)
            if answer is Confirm.OURS:
                t.expires[key] = t.expires[gate] = t.now_ms() + _ms(ttl)
            return answer

    async def finish(self, items: list[tuple[str, dict[str, object]]], ttl: timedelta,
                     clear: Sequence[str] = ()) -> None:
        t = self.table
        with t.lock:
            for key, outcome in items:
                t.put(key, "done:" + orjson.dumps(outcome).decode(), ttl)
            for gate in clear:
                t.get(gate)
                if t.model.clear(gate):
                    t.expires.pop(gate, None)

    async def release(self, keys: list[str]) -> None:
        """Drop the keys that hold our own pending value."""
        t = self.table
        with t.lock:
            for k in keys:
                v = t.get(k)
                if v is not None and v.startswith(self.pending_prefix):
                    t.delete(k)

    async def claim_content(self, items: list[tuple[str, str]],
                            window: timedelta) -> list[str | None]:
        t = self.table
        with t.lock:
            out: list[str | None] = []
            for key, mid in items:
                prev = t.get(key)
                if prev is None:
                    t.put(key, mid, window)
                out.append(None if prev is None or prev == mid else prev)
            return out

    async def release_content(self, items: list[tuple[str, str]]) -> None:
        t = self.table
        with t.lock:
            for key, mid in items:
                v = t.get(key)
                if v == mid:
                    t.delete(key)

    async def count_crash(self, flow: str, source: str, ttl: timedelta) -> int:
        t = self.table
        with t.lock:
            counts = t.crashes(flow)
            counts[source] = counts.get(source, 0) + 1
            t.crash_expires[flow] = t.now_ms() + int(ttl.total_seconds()) * 1000
            return counts[source]

    async def crashes(self, flow: str) -> dict[str, int]:
        with self.table.lock:
            return dict(self.table.crashes(flow))

    async def aclose(self) -> None:
        return None

