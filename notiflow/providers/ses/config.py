"""The Amazon SES plug-in's settings section (``NOTIFLOW_SES__...``)."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from pydantic import Field, SecretStr

from notiflow.schemas.enums import Channel
from notiflow.settings.plugin import ProviderPlugin, SectionSpec, configured, url_fields
from notiflow.settings.providers import ProviderRoute
from notiflow.settings.section import _Frozen


class SesSettings(_Frozen):
    """Amazon SES v2 (``SendEmail``) with an IAM access key; requests are signed with AWS
    Signature Version 4 (botocore). ``endpoint_url`` is ``https://email.<region>.amazonaws.com``
    or ``notiflow fakes``. SES is an email route once the key is configured."""

    provider_id: str = "ses"
    endpoint_url: str = "http://127.0.0.1:18090/ses"
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    """Temporary credentials (an assumed role) carry one."""
    from_email: str = "notifications@example.com"
    """A verified identity (address or domain) of the account."""
    configuration_set: str | None = None
    """The configuration set whose event destination publishes delivery events (SNS)."""
    sns_topic_arns: tuple[str, ...] = ()
    """The SNS topics whose deliveries ``POST /webhooks/ses`` takes (SES events); none:
    every post is refused."""
    sns_host_pattern: str = r"sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?"
    """Hosts a ``SigningCertURL`` or ``SubscribeURL`` may name (a regular expression the
    whole host must match): SNS's public endpoints."""
    sns_require_https: bool = True
    """Off only for the emulator on loopback."""
    sns_cert_ttl: timedelta = timedelta(hours=24)
    """How long a fetched signing certificate is used before it is fetched again."""
    sns_max_age: timedelta = Field(timedelta(hours=1), gt=timedelta(0))
    """Oldest (and furthest future) ``Timestamp`` a delivery may carry; older ones are
    refused as replays. Keep it above the subscription's retry span (SNS's default policy
    retries for about 20 seconds). Wall-clock, not scaled by ``time_scale``."""
    sns_signature_v1: bool = False
    """Also accept ``SignatureVersion`` 1 (SHA-1); off: only 2 (SHA-256), which the topic
    must be set to (its ``SignatureVersion`` attribute)."""


class SesPlugin(ProviderPlugin):
    """The plug-in's field of :class:`~notiflow.settings.Settings`."""

    SECTION: ClassVar[SectionSpec] = SectionSpec(
        "ses", SesSettings, configured("access_key_id", "secret_access_key"),
        ProviderRoute(provider_id="ses", channel=Channel.EMAIL, cost=0.3, reliability=0.99),
        endpoints=url_fields("endpoint_url"))
    ses: SesSettings = SesSettings()
