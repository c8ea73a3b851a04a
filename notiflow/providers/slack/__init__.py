"""Slack incoming webhooks (the ``CHAT`` channel): ``client``
(:class:`~.client.SlackWebhook`, the wire format) and ``classify`` (its table). No delivery
receipts: an accepted post is in the channel.
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator`` and its development environment in ``dev``."""
