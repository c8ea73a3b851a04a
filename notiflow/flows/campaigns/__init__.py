"""The campaign pipeline: a plain asyncio process that expands each campaign's manifest into
P2/P3 messages and announces the campaign's state changes.

Modules in recipe order:

- :mod:`.expander`: leases on campaigns, read, map, pace, write, checkpoint; ``main``;
- :mod:`.manifest`: manifests read incrementally and rows mapped to ingest records (pure);
- :mod:`.state_notices`: campaign state webhooks to the campaign's ``webhook``.
"""
