"""Cassandra: the operational source of truth (messages, attempts, idempotency, templates,
recipient preference state, device tokens) and the operators' query tables
(``ops/queries.md``). :mod:`.session` connects and runs statements; one module per
aggregate prepares and runs its own; :mod:`.store` composes them per session."""
