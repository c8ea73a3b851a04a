"""Microsoft Teams incoming webhooks (the ``CHAT`` channel): ``client``
(:class:`~.client.TeamsWebhook`, the wire format) and ``classify`` (its tables). No delivery
receipts.
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator`` and its development environment in ``dev``."""
