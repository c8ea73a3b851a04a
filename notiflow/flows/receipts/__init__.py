"""The receipts pipeline: the reconciliation dataflow, the single place where status (events
and provider receipts) reaches Cassandra.

Modules in recipe order:

- :mod:`.reconcile`: ``build_reconcile_flow``, parse, park, apply;
- :mod:`.receipt_match`: which attempt a receipt may change (pure).
"""
