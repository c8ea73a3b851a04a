"""Cluster-wide send capacity: provider rate, tier reservations, tenant rate — one Lua call.

Every send worker asks :class:`CapacityLimiter` before each provider call. The limiter spends
tokens from a small local lease and refills it from Redis, where one script decides per call,
atomically, on Redis's clock (``TIME``; tests pass ``now_us`` instead):

Provider account ``p`` (contracted rate ``R`` requests/s, window ``W`` = 1 s)
    A sliding-window log per (provider, tier). Each request adds one entry
    ``{seq}:{demand}:{granted}`` scored by its time in µs; entries older than ``W`` are
    dropped. Guarantee (a): for every grant at time ``g``, the regular grants of all tiers in
    ``(g - W, g]`` total at most ``R``.

    *Proof.* Decision times never decrease (``now`` is clamped to the last decision time), and
    a request is granted ``k`` only if the grants already logged in ``(g - W, g]`` plus ``k``
    fit under ``R`` (the last prefix below, ``P_3 = R``). Take any window ``(a - W, a]`` and
    its last decided grant, at ``g* <= a``: every grant in the window was decided no later and
    lies in ``(a - W, g*] ⊆ (g* - W, g*]``, which held at most ``R`` right after ``g*``. So no
    window of length ``W`` ever holds more than ``R`` grants. ∎ The same argument bounds the
    P0 emergency log by ``p0_emergency_rate``.

Tier reservations (capacities ``S_h = share_h · R``, prefix sums ``P_m = S_0 + … + S_m``)
    Tier ``t`` may be granted ``k`` iff for every ``m >= t``::

        Σ_{h<t} max(G_h, min(D_h, S_h)) + Σ_{t<=h<=m} G_h + k <= P_m

    where ``G_h`` / ``D_h`` are tier ``h``'s grants / demand (asked tokens, granted or not) in
    the window. ``m = t`` is the design rule "own share plus the unused share of every higher
    tier" (``unused_h = S_h - min(D_h, S_h)``); ``m > t`` stops two lower tiers from both
    borrowing the same unused share (which would eat a still lower tier's reservation);
    ``m = 3`` is the provider limit, with the outstanding reservations of higher tiers in
    demand held back. Lower tiers' reservations never hold back a higher tier.

    Guarantee (b): if P0's demand in ``(g - W, g]`` was at least ``S_0`` at every lower-tier
    grant ``g`` in ``(T - W, T]``, a P0 request of ``n`` at ``T`` is granted
    ``min(n, ⌊S_0 - G_0(T)⌋)`` (tenant limit aside): a P0 request is cut short only once P0
    holds its whole share ``⌊S_0⌋`` in the window. (For each ``m >= 1`` the last grant of
    tiers ``1..m`` in the window satisfied its ``m``-constraint with ``min(D_0, S_0) = S_0``,
    so ``Σ_{1<=h<=m} G_h(T) <= P_m - S_0``; argue as in (a).) Borrowed capacity therefore
    returns to P0 once P0's demand has stayed at or above its share for ``W``.

    Guarantee (c): a tier alone may use ``P_t`` — P3 alone the whole ``R``.

P0 emergency quota (``p0_emergency_rate`` ``E``)
    Extra contracted capacity only P0 may use, when the regular rule grants P0 less than it
    asked. Its own log; it does not count against ``R``: the provider sees at most ``R + E``.

Tenant (optional; rate ``r`` from the caller, e.g. ``TenantConfig.rate_limit``)
    A token bucket (rate ``r``, burst ``max(1, r · 1 s)``) in the same script: a call is
    granted ``k = min(asked, provider room, tenant tokens)`` and all three are charged ``k``
    together. Demand is counted only up to what the tenant could take, so a throttled tenant
    does not hold capacity back from lower tiers.

Time: rates are requests per (real) second and are NOT multiplied by ``time_scale`` — they
model contracts of real providers and emulators. A grant counts at its Redis time; a leased
token is spent up to the lease TTL later, so calls reaching the provider in a 1 s window may
also include tokens leased up to one TTL before it (at most one lease per worker).

Redis key layout (namespace = ``settings.topic_prefix``)::

    {ns}cap:{provider}:log:{P0..P3}  zset  score = µs, member = seq:demand:granted
    {ns}cap:{provider}:em            zset  P0 emergency grants, member = seq:granted
    {ns}cap:{provider}:meta          hash  last, seq, em, g0..g3, d0..d3 (window sums)
    {ns}cap:tenant:{tenant}          hash  tokens (%.17g), ts (µs)

:func:`decide` is the reference implementation in Python; the Lua script mirrors its
arithmetic operation for operation (same IEEE doubles), so both decide identically. The wait
search walks the logs in time order (Lua: merged in chunks); its result does not depend on the
order of entries with equal times, because expiring an entry never reduces a tier's room.

Modules: ``model`` (rules, requests and decisions as values; the reference model, time passed
in), ``scripts/decide.lua`` (the script, shipped as package data), ``store`` (the Redis store
:class:`CapacityStore` and the in-process :class:`ModelStore`), ``limiter`` (the worker-side
:class:`CapacityLimiter` and its metrics). Every public name is importable from this package.
"""

from notiflow.adapters.ratelimit.limiter import CapacityLimiter, LimiterStats, observe_fill
from notiflow.adapters.ratelimit.model import (
    TIERS,
    WINDOW_US,
    CapacityRules,
    Decision,
    LogEntry,
    ModelState,
    ProviderRule,
    RedisDown,
    Request,
    TenantBucket,
    decide,
    room,
)
from notiflow.adapters.ratelimit.store import (
    DECIDE_LUA,
    CapacityStore,
    DecisionSource,
    ModelStore,
)

__all__ = [
    "DECIDE_LUA",
    "TIERS",
    "WINDOW_US",
    "CapacityLimiter",
    "CapacityRules",
    "CapacityStore",
    "Decision",
    "DecisionSource",
    "LimiterStats",
    "LogEntry",
    "ModelState",
    "ModelStore",
    "ProviderRule",
    "RedisDown",
    "Request",
    "TenantBucket",
    "decide",
    "observe_fill",
    "room",
]
