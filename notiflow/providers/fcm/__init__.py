"""FCM push: ``client`` (:class:`~.client.FcmPush`, the wire format), ``classify`` (its
tables), ``tokens`` (the service-account assertion and the cached access token). FCM posts no
delivery receipts, so there are no ``receipts`` or ``signature`` modules.
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator`` and its development environment in ``dev``."""
