"""The one settings object.

Every process builds exactly one frozen :class:`Settings` (env prefix ``NOTIFLOW_``, nested
keys joined by ``__``, optional TOML file named by ``NOTIFLOW_CONFIG``) and passes it
explicitly. Secrets (tenant tokens, provider credentials, the DLQ key) only ever come from the
environment or that file, never from code; the transport secrets towards Kafka, Cassandra and
Redis (``TRANSPORT_SECURITY``) from the environment only.

:class:`Settings` is in ``core``; each family of sections has a module of its own: ``tiers``
(tier policy, caps, quiet hours, category tiers, bulk yielding), ``tenants`` (tenants, their
senders and status webhooks), ``security`` (JWTs, egress, ingest encryption and binding),
``transport`` (TLS and credentials towards the stores), ``providers`` (what every provider
account shares: routes, breakers, chat webhooks), ``plugin`` (how a provider plug-in adds its
section), ``serving`` (the API's server, the Kafka outage window),
``planning`` (scheduling, campaigns), ``storage`` (object store, archive), ``rendering``,
``dead_letters`` and ``observability``. Each provider's own section is in its plug-in
(``notiflow.providers.<name>.config``), registered in :mod:`notiflow.providers.registry`.
Import every other name from this package.
"""

from __future__ import annotations

from notiflow.providers.registry import DEFAULT_ROUTES
from notiflow.settings.core import Settings, load_settings
from notiflow.settings.dead_letters import DlqRule
from notiflow.settings.observability import TelemetrySettings
from notiflow.settings.planning import CampaignRule, SchedulingRule
from notiflow.settings.providers import (
    BreakerRule,
    ChatSettings,
    PaceRule,
    ProviderRoute,
    WebhookPrefixes,
    insecure_endpoint,
)
from notiflow.settings.rendering import PreferencePage, RenderLimits, SmsReplies, Unsubscribe
from notiflow.settings.security import EgressSettings, IngestBinding, IngestEncryption, JwtAuth
from notiflow.settings.serving import (
    ApiRedisTimeout,
    ApiTls,
    OutageWindow,
    ServerLimits,
)
from notiflow.settings.storage import ArchiveSettings, ObjectStoreSettings
from notiflow.settings.tenants import (
    MIN_INBOX_KEY_BYTES,
    MIN_INGEST_KEY_BYTES,
    MIN_TOKEN_CHARS,
    WEBHOOK_SECRET_BYTES,
    ClientWebhookRule,
    TenantConfig,
    narrowed_senders,
    normalised_senders,
    sender_matches,
)
from notiflow.settings.tiers import (
    DEFAULT_CAPS,
    DEFAULT_SHARES,
    DEFAULT_TIERS,
    NEVER_URGENT,
    CapRule,
    CategoryTiers,
    QuietHours,
    RetryBudget,
    TierPolicy,
    YieldRule,
)
from notiflow.settings.transport import (
    TRANSPORT_SECURITY,
    CassandraSecurity,
    KafkaProtocol,
    KafkaSecurity,
    RedisSecurity,
    SaslMechanism,
    TlsFiles,
)

__all__ = [
    "DEFAULT_CAPS",
    "DEFAULT_ROUTES",
    "DEFAULT_SHARES",
    "DEFAULT_TIERS",
    "MIN_INBOX_KEY_BYTES",
    "MIN_INGEST_KEY_BYTES",
    "MIN_TOKEN_CHARS",
    "NEVER_URGENT",
    "TRANSPORT_SECURITY",
    "WEBHOOK_SECRET_BYTES",
    "ApiRedisTimeout",
    "ApiTls",
    "ArchiveSettings",
    "BreakerRule",
    "CampaignRule",
    "CapRule",
    "CassandraSecurity",
    "CategoryTiers",
    "ChatSettings",
    "ClientWebhookRule",
    "DlqRule",
    "EgressSettings",
    "IngestBinding",
    "IngestEncryption",
    "JwtAuth",
    "KafkaProtocol",
    "KafkaSecurity",
    "ObjectStoreSettings",
    "OutageWindow",
    "PaceRule",
    "PreferencePage",
    "ProviderRoute",
    "QuietHours",
    "RedisSecurity",
    "RenderLimits",
    "RetryBudget",
    "SaslMechanism",
    "SchedulingRule",
    "ServerLimits",
    "Settings",
    "SmsReplies",
    "TelemetrySettings",
    "TenantConfig",
    "TierPolicy",
    "TlsFiles",
    "Unsubscribe",
    "WebhookPrefixes",
    "YieldRule",
    "insecure_endpoint",
    "load_settings",
    "narrowed_senders",
    "normalised_senders",
    "sender_matches",
]
