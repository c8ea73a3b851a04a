"""Twilio SMS: ``client`` (:class:`~.client.TwilioSms`, the wire format), ``classify`` (its
tables), ``receipts`` (status callbacks) and ``signature`` (``X-Twilio-Signature``).
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator``, the API's receipt routes in ``routes`` and its development
environment in ``dev``."""
