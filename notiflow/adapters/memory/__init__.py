"""The send step's ports in memory, for tests and local runs with no server.

Each port keeps the contract of its real adapter, built on the reference model that adapter
is tested against: leases and cancel gates (:mod:`.leases`, ``redis_dedup`` and
``cancel_gate.GateModel``), caps (:mod:`.caps`, ``LocalCaps``), breakers and capacity
(:mod:`.limits`, the breaker and rate-limit models), templates, message heads and recipient
states (:mod:`.stores`), boards (:mod:`.boards`) and provider accounts (:mod:`.providers`).
Time comes from an injected clock (:mod:`.clock`; a test's is a
:class:`notiflow.clocks.ManualClock`); nothing sleeps to expire. State shared by several event
loops is guarded by locks. :func:`memory_ports` opens a send flow's set.
"""

from notiflow.adapters.memory.providers import Answer, MemoryProvider
from notiflow.adapters.memory.state import MemoryState, configured_providers, memory_ports

__all__ = ["Answer", "MemoryProvider", "MemoryState", "configured_providers", "memory_ports"]
