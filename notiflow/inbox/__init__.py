"""The in-app inbox's live side: ``notiflow inbox`` (``server``), its user tokens (``tokens``),
the monotonic item states (``states``) and the hub of live connections (``hub``). The send
flow stores items through ``providers/inbox``; ``docs/inbox.md`` tells the whole."""
