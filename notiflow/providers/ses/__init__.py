"""Amazon SES v2 email: ``client`` (:class:`~.client.SesEmail`, ``SendEmail`` signed with
AWS Signature Version 4 by botocore, the ``ses`` extra) and ``classify`` (its error types).
Its settings section and registry entry are in ``config``, its ``SPEC`` in ``spec``, its
emulator in ``emulator``, the API's receipt routes in ``routes`` and its development
environment in ``dev``."""
