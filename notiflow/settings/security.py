"""Who may call and where tenant data may go: JWTs an identity provider signs, the
addresses tenant-supplied URLs may lead to, and the encryption and tenant binding of ingest
records."""

from __future__ import annotations

from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from notiflow.settings.section import _Frozen


class JwtAuth(_Frozen):
    """Callers authenticated by OAuth2 client-credentials access tokens (JWTs) that an
    identity provider signs, verified against its JWKS (docs/api.md, "Authentication").
    Off while ``jwks_url`` is unset."""

    jwks_url: str | None = None
    issuer: str | None = None
    """The ``iss`` every token must carry (required once ``jwks_url`` is set)."""
    audience: str | None = None
    """The ``aud`` every token must name (required once ``jwks_url`` is set)."""
    algorithms: tuple[Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256",
                              "ES384", "ES512", "EdDSA"], ...] = ("RS256", "ES256")
    """Asymmetric algorithms only: a shared-secret algorithm with a published key would let
    anyone sign."""
    scope: str | None = "notiflow.send"
    """A scope the token's ``scope`` (space-separated) or ``scp`` (list) must contain; None:
    no scope check."""
    leeway: timedelta = timedelta(seconds=30)
    """Clock skew allowed on ``exp``, ``nbf`` and ``iat``."""
    tenant_claim: str = "tenant"
    """The claim naming the tenant (one of ``NOTIFLOW_TENANTS``, whose limits apply)."""
    tiers_claim: str = "tiers"
    channels_claim: str = "channels"
    templates_claim: str = "templates"
    senders_claim: str = "senders"
    """Optional claims (lists) that narrow what the tenant may send for this token; a token
    never widens its tenant's ``tiers``, ``channels``, ``templates`` or ``senders``."""
    keys_ttl: timedelta = timedelta(minutes=10)
    """How long fetched keys are used before the key set is fetched again."""
    min_refetch: timedelta = timedelta(seconds=30)
    """An unknown key id refetches the key set at most this often (rotation)."""
    static_tokens: bool = False
    """Whether the tenants' static tokens are still accepted beside JWTs once ``jwks_url`` is
    set (a migration); while JWTs are off, static tokens are the only credential."""

    @model_validator(mode="after")
    def _complete(self) -> JwtAuth:
        if self.jwks_url and not (self.issuer and self.audience):
            raise ValueError("jwt.jwks_url needs jwt.issuer and jwt.audience")
        return self

    @property
    def accepts_static_tokens(self) -> bool:
        """Static tokens authenticate: JWTs are off, or ``static_tokens`` asks for both."""
        return not self.jwks_url or self.static_tokens


class EgressSettings(_Frozen):
    """Where tenant-supplied URLs (status webhooks, campaign webhooks) may lead
    (``notiflow/egress.py``): public unicast addresses over ``https`` only, unless allowed
    here. The cloud metadata addresses are refused whatever these say."""

    allow_http: bool = False
    """Accept ``http://`` URLs (the development environment of ``notiflow.devenv``)."""
    allow_networks: tuple[IPv4Network | IPv6Network, ...] = ()
    """Addresses accepted although not public (``["127.0.0.0/8"]`` for the emulators)."""
    allow_hosts: tuple[str, ...] = ()
    """Host names whose resolved addresses are accepted although not public (an in-cluster
    receiver, by its exact name)."""
    resolve_timeout: timedelta = timedelta(seconds=2)
    """Longest wait for one name's addresses; a name that does not resolve within it is
    refused (422 at acceptance, a retried attempt at send time)."""
    resolvers: int = Field(8, ge=1, le=64)
    """Threads per process that resolve tenant host names (apart from the loop's own)."""

    @field_validator("allow_hosts")
    @classmethod
    def _lower_hosts(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(h.strip().lower().rstrip(".") for h in v if h.strip())


class IngestEncryption(_Frozen):
    """Envelope encryption of the recipient and variables of ingest records
    (``adapters/envelope.py``): each process seals with a data key of its own, wrapped by the
    first key-encryption key; every listed key opens."""

    keys: SecretStr | None = None
    """Key-encryption keys, ``kid:key`` separated by commas (``key``: 32 random bytes,
    URL-safe base64). None: records travel in clear. Rotation: put the new key first, drop
    the old one once no record sealed under it can still be read (the ingest topics'
    retention and the longest schedule)."""
    required: bool = False
    """Dead-letter ingest records whose recipient and variables arrive in clear (an upstream
    producer writing to the ingest topics without the key)."""
    data_key_ttl: timedelta = timedelta(minutes=5)
    """How long a process seals with one data key before drawing the next."""


class IngestBinding(_Frozen):
    """Ingest records bound to their tenant (``notiflow/ingest_binding.py``): an HMAC header
    by the platform key or by a key of the tenant the record names."""

    keys: SecretStr | None = None
    """Platform keys (at least 32 bytes each) every platform writer signs with, comma
    separated: the first signs, every one verifies. Unset: one derived from each
    ``dlq_key``."""
    required: bool | None = None
    """Dead-letter records that carry no binding (``tenant_claim_refused``). None: required
    outside ``development``. A binding that does not verify is refused either way."""
