"""Circuit breakers per provider account, shared by every worker through Redis.

Every send worker asks :class:`CircuitBreakers` before a provider call (:meth:`~CircuitBreakers.
allow`) and reports the outcome after it (:meth:`~CircuitBreakers.record`). The state of each
provider account lives in one Redis hash and changes only inside one Lua script call, on Redis's
clock (``TIME``; tests pass ``now_us``), so all processes see one state machine.

- :mod:`.model`: the rules (verdicts, CLOSED / OPEN / HALF_OPEN, route weight) as a pure state
  machine, the reference the script mirrors;
- ``scripts/step.lua``: the script;
- :mod:`.store`: Redis I/O (key layout, the script call) and the model behind the same
  interface;
- :mod:`.facade`: :class:`CircuitBreakers`, one process's cached view of the shared state,
  with local breakers while Redis is down.
"""

from __future__ import annotations

from notiflow.adapters.breaker.facade import (
    NORMAL,
    Admission,
    AdmissionKind,
    BreakerStats,
    CircuitBreakers,
    StateChange,
)
from notiflow.adapters.breaker.model import (
    PEEK,
    BreakerParams,
    ModelState,
    Op,
    Snapshot,
    State,
    StepResult,
    Transition,
    Verdict,
    apply,
    classify,
    effective_state,
    run_model,
    snapshot,
    weight_at,
)
from notiflow.adapters.breaker.store import BreakerSource, BreakerStore, ModelStore

__all__ = [
    "NORMAL", "PEEK", "Admission", "AdmissionKind", "BreakerParams", "BreakerSource",
    "BreakerStats", "BreakerStore", "CircuitBreakers", "ModelState", "ModelStore", "Op",
    "Snapshot", "State", "StateChange", "StepResult", "Transition", "Verdict", "apply",
    "classify", "effective_state", "run_model", "snapshot", "weight_at",
]
