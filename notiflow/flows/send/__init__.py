"""The send pipeline: the dataflow of one tier, from ``ingest.{channel}.{tier}`` to the
provider and on to ``notify.events``.

Modules in recipe order:

- :mod:`.flow`: ``build_send_flow``, the dataflow and its recipe;
- :mod:`.ordering`: strict ordering per ``(tenant, ordering_key)`` (sequence, then send);
- :mod:`.consent`: the join with recipient preferences and the policy step;
- :mod:`.dispatch`: the keyed send logic and the per-process dispatcher;
- :mod:`.stages`: the send step, stage by stage (admit, gates, render, route, call, ...);
- :mod:`.cap_rules`: recipient frequency caps and the tenant's daily marketing cap;
- :mod:`.routing`: which provider account sends an attempt;
- :mod:`.policy`: retry rules.
"""
