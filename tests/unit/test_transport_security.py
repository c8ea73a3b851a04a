"""Transport security of the Kafka, Cassandra and Redis clients (``kafka_security``,
``cassandra_security``, ``redis_security``): the settings refuse incoherent combinations and
secrets in the config file, and each store's one builder puts the options into its client's
configuration."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from cassandra.auth import PlainTextAuthProvider
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError
from pydantic_settings import SettingsError
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.sentinel import SentinelManagedSSLConnection

from notiflow.adapters.bytewax_kafka import kafka_source
from notiflow.adapters.cassandra import session as cassandra_session
from notiflow.adapters.cassandra.session import cluster_security
from notiflow.adapters.kafka_io import kafka_config, producer_config, security_config
from notiflow.adapters.redis_pool import auth_options, redis_client, tls_options
from notiflow.settings import CassandraSecurity, KafkaSecurity, RedisSecurity, Settings


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A throw-away CA's certificate and a client certificate and key it issued."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    client = ca.issue_cert("notiflow-client")
    paths = {"ca": d / "ca.pem", "cert": d / "client.pem", "key": d / "client.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    client.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    client.private_key_pem.write_to_path(str(paths["key"]))
    return paths


def mtls(pki: dict[str, Path]) -> dict[str, Any]:
    return {"ca_file": pki["ca"], "cert_file": pki["cert"], "key_file": pki["key"]}


# settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    {"protocol": "PLAINTEXT", "ca_file": "/ca.pem"},
    {"protocol": "SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"},
    {"protocol": "SASL_SSL"},
    {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u"},
    {"protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER", "oauth_client_id": "c",
     "oauth_client_secret": "s"},
    {"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u",
     "sasl_password": "p", "oauth_scope": "kafka"},
    {"protocol": "SSL", "cert_file": "/client.pem"},
    {"protocol": "SSL", "key_password": "k"},
])
def test_incoherent_kafka_security_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        KafkaSecurity(**options)


@pytest.mark.parametrize("options", [
    {"ca_file": "/ca.pem"},
    {"tls": True, "username": "notiflow"},
])
def test_incoherent_cassandra_security_is_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CassandraSecurity(**options)


def test_redis_tls_files_need_a_tls_url() -> None:
    with pytest.raises(ValidationError, match="rediss"):
        Settings(redis_url="redis://127.0.0.1:16379/0",
                 redis_security={"ca_file": "/ca.pem"})
    Settings(redis_url="rediss+sentinel://h:26379/notiflow",
             redis_security={"ca_file": "/ca.pem"})


def test_secrets_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFLOW_KAFKA_SECURITY__PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("NOTIFLOW_KAFKA_SECURITY__SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("NOTIFLOW_KAFKA_SECURITY__SASL_USERNAME", "notiflow")
    monkeypatch.setenv("NOTIFLOW_KAFKA_SECURITY__SASL_PASSWORD", "from-env")
    monkeypatch.setenv("NOTIFLOW_CASSANDRA_SECURITY__PASSWORD", "cql-secret")
    monkeypatch.setenv("NOTIFLOW_CASSANDRA_SECURITY__USERNAME", "notiflow")
    s = Settings()
    assert s.kafka_security.sasl_password is not None
    assert s.kafka_security.sasl_password.get_secret_value() == "from-env"
    assert "from-env" not in repr(s) and "cql-secret" not in repr(s)


@pytest.mark.parametrize(("section", "secret"), [
    ("kafka_security", "sasl_password"), ("kafka_security", "oauth_client_secret"),
    ("cassandra_security", "password"), ("redis_security", "key_password"),
])
def test_the_config_file_may_not_hold_transport_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, section: str, secret: str) -> None:
    config = tmp_path / "notiflow.toml"
    config.write_text(f'[{section}]\n{secret} = "in-a-file"\n')
    monkeypatch.setenv("NOTIFLOW_CONFIG", str(config))
    with pytest.raises(SettingsError, match=f"NOTIFLOW_{section.upper()}__{secret.upper()}"):
        Settings()


def test_the_config_file_may_name_the_files(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "notiflow.toml"
    config.write_text('[kafka_security]\nprotocol = "SSL"\nca_file = "/etc/kafka/ca.crt"\n')
    monkeypatch.setenv("NOTIFLOW_CONFIG", str(config))
    assert Settings().kafka_security.ca_file == Path("/etc/kafka/ca.crt")


# Kafka ------------------------------------------------------------------------------------

def test_plaintext_kafka_sets_only_the_protocol() -> None:
    assert security_config(KafkaSecurity()) == {"security.protocol": "PLAINTEXT"}


def test_mutual_tls_kafka(pki: dict[str, Path]) -> None:
    cfg = security_config(KafkaSecurity(protocol="SSL", key_password="kp", **mtls(pki)))
    assert cfg == {"security.protocol": "SSL",
                   "ssl.endpoint.identification.algorithm": "https",
                   "ssl.ca.location": str(pki["ca"]),
                   "ssl.certificate.location": str(pki["cert"]),
                   "ssl.key.location": str(pki["key"]),
                   "ssl.key.password": "kp"}


def test_scram_over_tls_without_hostname_check(pki: dict[str, Path]) -> None:
    cfg = security_config(KafkaSecurity(
        protocol="SASL_SSL", ca_file=pki["ca"], check_hostname=False,
        sasl_mechanism="SCRAM-SHA-512", sasl_username="notiflow", sasl_password="pw"))
    assert cfg == {"security.protocol": "SASL_SSL",
                   "ssl.endpoint.identification.algorithm": "none",
                   "ssl.ca.location": str(pki["ca"]),
                   "sasl.mechanism": "SCRAM-SHA-512",
                   "sasl.username": "notiflow", "sasl.password": "pw"}


def test_oauthbearer_uses_librdkafkas_oidc_flow() -> None:
    cfg = security_config(KafkaSecurity(
        protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
        oauth_token_url="https://idp.example/token", oauth_client_id="notiflow",
        oauth_client_secret="cs", oauth_scope="kafka"))
    assert cfg == {"security.protocol": "SASL_SSL",
                   "ssl.endpoint.identification.algorithm": "https",
                   "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                   "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
                   "sasl.oauthbearer.client.id": "notiflow",
                   "sasl.oauthbearer.client.secret": "cs",
                   "sasl.oauthbearer.scope": "kafka"}


def kafka_settings(pki: dict[str, Path]) -> Settings:
    return Settings(kafka_bootstrap="127.0.0.1:1", kafka_security={
        "protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-256", "sasl_username": "u",
        "sasl_password": "p", **mtls(pki)})


def test_every_kafka_builder_carries_the_security(pki: dict[str, Path]) -> None:
    s = kafka_settings(pki)
    wanted = security_config(s.kafka_security).items()
    source = kafka_source(s, ["t"], 10)
    for cfg in (kafka_config(s), kafka_config(s, {"group.id": "g"}), producer_config(s),
                source._add_config, source._admin_config):
        assert cfg["bootstrap.servers"] == "127.0.0.1:1"
        assert wanted <= cfg.items()


def test_librdkafka_accepts_the_configurations(pki: dict[str, Path]) -> None:
    quiet = logging.getLogger("test.transport.kafka")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    s = kafka_settings(pki)
    Producer(producer_config(s, logger=quiet))
    AdminClient(kafka_config(s, {"logger": quiet}))
    Consumer(kafka_config(s, {"group.id": "g", "logger": quiet})).close()


# Cassandra --------------------------------------------------------------------------------

def test_cassandra_without_security_adds_nothing() -> None:
    assert cluster_security(CassandraSecurity()) == {}


def test_cassandra_mutual_tls_and_password(pki: dict[str, Path]) -> None:
    options = cluster_security(CassandraSecurity(tls=True, username="notiflow",
                                                 password="pw", **mtls(pki)))
    ctx, auth = options["ssl_context"], options["auth_provider"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname
    assert isinstance(auth, PlainTextAuthProvider)
    assert (auth.username, auth.password) == ("notiflow", "pw")


def test_connect_hands_the_security_to_the_driver(pki: dict[str, Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    made: dict[str, Any] = {}

    class Refused(Exception):
        pass

    class FakeCluster:
        def __init__(self, hosts: list[str], **kwargs: Any) -> None:
            made.update(kwargs)

        def connect(self, keyspace: str | None = None) -> None:
            raise Refused

        def shutdown(self) -> None:
            pass

    monkeypatch.setattr(cassandra_session, "Cluster", FakeCluster)
    s = Settings(cassandra_security={"tls": True, "ca_file": pki["ca"],
                                     "check_hostname": False})
    with pytest.raises(Refused):
        cassandra_session.connect(s)
    assert not made["ssl_context"].check_hostname
    assert made["ssl_context"].verify_mode == ssl.CERT_REQUIRED


# Redis ------------------------------------------------------------------------------------

def test_redis_tls_and_auth_options(pki: dict[str, Path]) -> None:
    security = RedisSecurity(username="notiflow", password="pw", key_password="kp",
                             **mtls(pki))
    assert tls_options(security) == {
        "ssl_cert_reqs": "required", "ssl_check_hostname": True,
        "ssl_ca_certs": str(pki["ca"]), "ssl_certfile": str(pki["cert"]),
        "ssl_keyfile": str(pki["key"]), "ssl_password": "kp"}
    assert auth_options(security) == {"username": "notiflow", "password": "pw"}
    assert auth_options(RedisSecurity()) == {}


async def test_a_rediss_url_gets_a_tls_pool(pki: dict[str, Path]) -> None:
    s = Settings(redis_url="rediss://cache.example:6380/0",
                 redis_security={"password": "pw", **mtls(pki)})
    client = redis_client(s, timeout=1)
    pool = client.connection_pool
    assert pool.connection_class is SSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == str(pki["ca"])
    assert pool.connection_kwargs["ssl_certfile"] == str(pki["cert"])
    assert pool.connection_kwargs["password"] == "pw"
    await client.aclose()


async def test_a_plain_url_gets_no_tls_options() -> None:
    client = redis_client(Settings(redis_url="redis://127.0.0.1:1/0",
                                   redis_security={"password": "pw"}), timeout=1)
    pool = client.connection_pool
    assert pool.connection_class is Connection
    assert not any(k.startswith("ssl") for k in pool.connection_kwargs)
    await client.aclose()


async def test_a_tls_sentinel_url_secures_sentinels_and_primary(pki: dict[str, Path]) -> None:
    s = Settings(redis_url="rediss+sentinel://:url-pw@s1:26379,s2:26379/notiflow/1",
                 redis_security={"password": "settings-pw", **mtls(pki)})
    client = redis_client(s, timeout=1)
    pool = client.connection_pool
    assert pool.connection_class is SentinelManagedSSLConnection
    assert pool.connection_kwargs["ssl_ca_certs"] == str(pki["ca"])
    assert pool.connection_kwargs["password"] == "url-pw"
    sentinel = pool.sentinel_manager.sentinels[0].connection_pool
    assert sentinel.connection_class is SSLConnection
    assert sentinel.connection_kwargs["ssl_certfile"] == str(pki["cert"])
    await client.aclose()


def test_the_drivers_local_data_centre_is_configured_or_the_first_replicated() -> None:
    assert Settings().cassandra_dc == "datacenter1"
    two = {"cassandra_replication": {"eu": 3, "us": 3}}
    assert Settings(**two).cassandra_dc == "eu"
    assert Settings(**two, cassandra_local_dc="us").cassandra_dc == "us"
    with pytest.raises(ValueError, match="not a data centre of cassandra_replication"):
        Settings(**two, cassandra_local_dc="ap")


def test_the_api_serves_https_and_mutual_tls_as_configured(tmp_path: Path) -> None:
    from notiflow.gateway.app import tls_options
    from notiflow.settings import ApiTls

    assert tls_options(Settings()) == {}
    cert, key, ca = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem"
    plain = tls_options(Settings(api_tls=ApiTls(cert_file=cert, key_file=key)))
    assert plain["ssl_certfile"] == str(cert) and plain["ssl_cert_reqs"] == ssl.CERT_NONE
    mutual = tls_options(Settings(api_tls=ApiTls(cert_file=cert, key_file=key,
                                                 client_ca_file=ca, client_certs="required")))
    assert (mutual["ssl_ca_certs"], mutual["ssl_cert_reqs"]) == (str(ca), ssl.CERT_REQUIRED)
    with pytest.raises(ValueError, match="go together"):
        ApiTls(cert_file=cert)
    with pytest.raises(ValueError, match="client_ca_file"):
        ApiTls(cert_file=cert, key_file=key, client_certs="required")
