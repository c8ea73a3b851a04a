"""The in-app inbox as the INAPP channel's provider: ``client``
(:class:`~.client.InboxDelivery`) stores the item in the user's inbox and publishes it to the
user's live connections (``notiflow inbox``). Its receipts (seen → DELIVERED, read → OPENED)
come from ``notiflow inbox`` when the user's app marks the item.
Its settings section and registry entry are in ``config`` and its ``SPEC`` in ``spec``."""
