"""SendGrid email: ``client`` (:class:`~.client.SendGridEmail`, the wire format),
``classify`` (its tables), ``receipts`` (Event Webhook events) and ``signature`` (the Event
Webhook's ECDSA signature).
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator``, the API's receipt routes in ``routes`` and its development
environment in ``dev``."""
