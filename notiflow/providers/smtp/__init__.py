"""SMTP email: ``client`` (:class:`~.client.SmtpEmail`, the pooled ESMTP sessions),
``message`` (the MIME message and its correlation headers), ``classify`` (reply and transport
tables), ``receipts`` (DSN bounces) and ``signature`` (the DSN webhook's bearer secret).
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator``, the API's receipt routes in ``routes`` and its development
environment in ``dev``."""
