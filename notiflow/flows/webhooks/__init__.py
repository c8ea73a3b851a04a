"""The client webhook pipeline: signed POSTs of each status change to the message's
``status_webhook``.

Modules in recipe order:

- :mod:`.status_webhooks`: ``build_webhook_flow``, the dataflow and its deliver logic;
- :mod:`.webhook_items`: the status change read from Kafka and the webhook job it becomes;
- :mod:`.webhook_age`: changes too old to announce (history skipped, the rest dead-lettered);
- :mod:`.webhook_resolve`: each change's tenant and URL;
- :mod:`.webhook_sender`: the POSTs of one process, bounded and behind circuit breakers.
"""
