"""Transport security towards Kafka, Cassandra and Redis: TLS files, SASL and passwords.
Their secrets come from the environment only (:data:`TRANSPORT_SECURITY`): the
``NOTIFLOW_CONFIG`` file's source refuses them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsError, TomlConfigSettingsSource

from notiflow.settings.section import _Frozen

KafkaProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


class TlsFiles(_Frozen):
    """TLS towards a store: whom to trust, the client's own certificate (mutual TLS), and
    whether the server's certificate must name the host connected to. Paths are read by the
    clients, not here."""

    ca_file: Path | None = None
    """PEM bundle of the CA(s) that signed the servers' certificates; None: the system's
    trust store."""
    cert_file: Path | None = None
    """PEM client certificate for mutual TLS (with ``key_file``)."""
    key_file: Path | None = None
    """PEM private key of ``cert_file``."""
    key_password: SecretStr | None = None
    """Password of an encrypted ``key_file`` (environment only)."""
    check_hostname: bool = True
    """Whether the server's certificate must name the address connected to. Off, the chain
    is still verified against ``ca_file``."""

    @property
    def tls_files(self) -> bool:
        """Whether any TLS file or key password is configured."""
        return any(v is not None for v in (self.ca_file, self.cert_file, self.key_file,
                                           self.key_password))

    @model_validator(mode="after")
    def _key_pair(self) -> TlsFiles:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.key_password is not None and self.key_file is None:
            raise ValueError("key_password without key_file")
        return self


class KafkaSecurity(TlsFiles):
    """Transport security of every Kafka client (librdkafka's ``security.protocol``, ``ssl.*``
    and ``sasl.*``; ``adapters/kafka_io.py`` :func:`kafka_config`)."""

    protocol: KafkaProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    """Required by the ``SASL_*`` protocols."""
    sasl_username: str | None = None
    """User of ``PLAIN`` and ``SCRAM-*``."""
    sasl_password: SecretStr | None = None
    """Password of ``PLAIN`` and ``SCRAM-*`` (environment only)."""
    oauth_token_url: str | None = None
    """``OAUTHBEARER``: the OIDC token endpoint librdkafka asks for a token (client
    credentials grant)."""
    oauth_client_id: str | None = None
    oauth_client_secret: SecretStr | None = None
    """``OAUTHBEARER`` client secret (environment only)."""
    oauth_scope: str | None = None

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @model_validator(mode="after")
    def _coherent(self) -> KafkaSecurity:
        if self.tls_files and not self.tls:
            raise ValueError(f"TLS files with protocol {self.protocol}: use SSL or SASL_SSL")
        password = (self.sasl_username, self.sasl_password)
        oauth = (self.oauth_token_url, self.oauth_client_id, self.oauth_client_secret)
        given = [v for v in (self.sasl_mechanism, *password, *oauth, self.oauth_scope)
                 if v is not None]
        if not self.sasl:
            if given:
                raise ValueError(f"SASL settings with protocol {self.protocol}: use "
                                 "SASL_SSL or SASL_PLAINTEXT")
            return self
        if self.sasl_mechanism is None:
            raise ValueError(f"protocol {self.protocol} needs a sasl_mechanism")
        needed, unused = (oauth, password) if self.sasl_mechanism == "OAUTHBEARER" else (
            password, (*oauth, self.oauth_scope))
        if any(v is None for v in needed) or any(v is not None for v in unused):
            what = ("oauth_token_url, oauth_client_id and oauth_client_secret"
                    if self.sasl_mechanism == "OAUTHBEARER" else
                    "sasl_username and sasl_password")
            raise ValueError(f"SASL {self.sasl_mechanism} takes {what} (and only those)")
        return self


class CassandraSecurity(TlsFiles):
    """TLS and password authentication of the Cassandra driver (``ssl_context``,
    ``PlainTextAuthProvider``; ``adapters/cassandra/session.py`` :func:`connect`)."""

    tls: bool = False
    """Connect with TLS (``client_encryption_options`` enabled on the nodes)."""
    username: str | None = None
    password: SecretStr | None = None
    """The role's password (environment only)."""

    @model_validator(mode="after")
    def _coherent(self) -> CassandraSecurity:
        if self.tls_files and not self.tls:
            raise ValueError("Cassandra TLS files without tls = true")
        if (self.username is None) != (self.password is None):
            raise ValueError("Cassandra username and password go together")
        return self


class RedisSecurity(TlsFiles):
    """TLS files and ACL credentials of every Redis client (``adapters/redis_pool.py``
    :func:`redis_client`); TLS itself is chosen by the URL (``rediss://``,
    ``rediss+sentinel://``)."""

    username: str | None = None
    """ACL user; None: the default user."""
    password: SecretStr | None = None
    """Password of ``username`` (or of the default user); environment only. A password in
    ``redis_url`` wins."""

    @model_validator(mode="after")
    def _coherent(self) -> RedisSecurity:
        if self.username is not None and self.password is None:
            raise ValueError("Redis username without password")
        return self


TRANSPORT_SECURITY = ("kafka_security", "cassandra_security", "redis_security")
"""Settings whose secrets come from the environment only (never from ``NOTIFLOW_CONFIG``)."""


def _secret_fields(model: type[BaseModel]) -> frozenset[str]:
    return frozenset(name for name, f in model.model_fields.items()
                     if SecretStr in (f.annotation, *get_args(f.annotation)))


class _ConfigFile(TomlConfigSettingsSource):
    """The ``NOTIFLOW_CONFIG`` file; refuses transport secrets in it (environment only)."""

    def __init__(self, settings_cls: type[BaseSettings], toml_file: Path) -> None:
        super().__init__(settings_cls, toml_file=toml_file)
        for section in TRANSPORT_SECURITY:
            model = settings_cls.model_fields[section].annotation
            given = self.toml_data.get(section)
            if isinstance(given, dict) and isinstance(model, type) and issubclass(
                    model, BaseModel):
                found = sorted(_secret_fields(model) & given.keys())
                if found:
                    raise SettingsError(
                        f"{toml_file}: {section}.{found[0]} is a secret: set it in the "
                        f"environment (NOTIFLOW_{section.upper()}__{found[0].upper()})")
