"""Circuit breakers per provider account, shared by every worker through Redis.

Every send worker asks :class:`~.facade.CircuitBreakers` before a provider call
(:meth:`~.facade.CircuitBreakers.allow`) and reports the outcome after it
(:meth:`~.facade.CircuitBreakers.record`). The state of each provider account lives in one
Redis hash and changes only inside one Lua script call, on Redis's clock (``TIME``; tests pass
``now_us``), so all processes see one state machine.

- :mod:`.model`: the rules (verdicts, CLOSED / OPEN / HALF_OPEN, route weight) as a pure state
  machine, the reference the script mirrors; the values the breakers answer with; and
  :class:`ModelStore`, the model behind the store interface;
- ``scripts/step.lua``: the script;
- :mod:`.store`: Redis I/O (key layout, the script call);
- :mod:`.facade`: :class:`~.facade.CircuitBreakers`, one process's cached view of the shared
  state, with local breakers while Redis is down.

This package exports the model only, so importing it loads no driver; the store and the
facade are imported from their modules.
"""

from __future__ import annotations

from notiflow.adapters.breaker.model import (
    NORMAL,
    PEEK,
    Admission,
    AdmissionKind,
    BreakerParams,
    BreakerSource,
    ModelState,
    ModelStore,
    Op,
    Snapshot,
    State,
    StateChange,
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

__all__ = [
    "NORMAL", "PEEK", "Admission", "AdmissionKind", "BreakerParams", "BreakerSource",
    "ModelState", "ModelStore", "Op", "Snapshot", "State", "StateChange", "StepResult",
    "Transition", "Verdict", "apply", "classify", "effective_state", "run_model", "snapshot",
    "weight_at",
]
