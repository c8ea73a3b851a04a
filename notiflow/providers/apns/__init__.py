"""APNs push: ``client`` (:class:`~.client.ApnsPush`, the HTTP/2 wire format), ``classify``
(its tables), ``tokens`` (the ES256 provider token). APNs posts no delivery receipts, so there
are no ``receipts`` or ``signature`` modules.

The client is imported behind a guard: a build without ``apns.client`` keeps the registry
working and ``spec.SPEC.open`` raises ``ValueError``.
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator`` and its development environment in ``dev``."""
