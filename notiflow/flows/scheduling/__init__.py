"""The scheduling pipeline: a plain asyncio process that publishes P2/P3 messages waiting in
``scheduled_work`` when they fall due, and materialises recurring schedules.

Modules in recipe order:

- :mod:`.due_work`: leases on shards, release of due rows, ``main``;
- :mod:`.recurring`: each occurrence a horizon ahead becomes an accepted message.
"""
