"""Vonage SMS: ``client`` (:class:`~.client.VonageSms`, the wire format), ``classify`` (its
tables and the answer reader), ``receipts`` (DLRs, ``client-ref``) and ``signature`` (``sig``
of signed DLRs).
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator``, the API's receipt routes in ``routes`` and its development
environment in ``dev``."""
