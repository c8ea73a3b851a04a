"""Cassandra over TLS with client certificates and password authentication through
:func:`notiflow.adapters.cassandra.session.connect`: a private node (the stack's Cassandra jars
and settings, on ports of its own) with ``client_encryption_options`` on, a PEM key store
from a throw-away ``trustme`` CA and ``PasswordAuthenticator``, serves a client configured by
``cassandra_security``; a client trusting another CA, one without a certificate, a wrong
password and a plaintext client are refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from cassandra import AuthenticationFailed
from cassandra.cluster import NoHostAvailable
from cryptography.hazmat.primitives import serialization

from notiflow.adapters.cassandra.session import connect
from notiflow.devenv import free_port
from notiflow.ops.stack import Stack, cassandra
from notiflow.ops.stack.process import port_open
from notiflow.settings import Settings
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class TlsCassandra:
    port: int
    files: dict[str, Path]

    def settings(self, **security: Any) -> Settings:
        return Settings(cassandra_hosts=("127.0.0.1",), cassandra_port=self.port,
                        cassandra_security=security)

    def good(self, **changes: Any) -> Settings:
        return self.settings(**{"tls": True, "ca_file": self.files["ca"],
                                "cert_file": self.files["client"],
                                "key_file": self.files["client_key"],
                                "username": "cassandra", "password": "cassandra", **changes})


def pkcs8(key_pem: bytes) -> bytes:
    """The key as unencrypted PKCS#8, what Cassandra's PEM key store reads."""
    key = serialization.load_pem_private_key(key_pem, None)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pki(d: Path) -> dict[str, Path]:
    ca, stranger = trustme.CA(), trustme.CA()
    node, client = ca.issue_cert("127.0.0.1", "localhost"), ca.issue_cert("notiflow")
    files = {n: d / f"{n}.pem" for n in ("ca", "stranger", "node", "client", "client_key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    stranger.cert_pem.write_to_path(str(files["stranger"]))
    files["node"].write_bytes(pkcs8(node.private_key_pem.bytes())
                              + b"".join(b.bytes() for b in node.cert_chain_pems))
    client.cert_chain_pems[0].write_to_path(str(files["client"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


def can_log_in(node: TlsCassandra) -> bool:
    try:
        cluster, _ = connect(node.good(), keyspace=None, connect_timeout=3.0)
    except (NoHostAvailable, AuthenticationFailed):
        return False
    cluster.shutdown()
    return True


@pytest.fixture(scope="module")
def tls_cassandra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsCassandra]:
    d = tmp_path_factory.mktemp("cassandra-tls")
    files = pki(d)
    port = free_port()
    settings = Settings(stack_dir=d / "stack", cassandra_port=port,
                        cassandra_storage_port=free_port(), cassandra_jmx_port=free_port(),
                        cassandra_heap_mb=384)
    stack = Stack(settings, log=lambda _m: None)
    stack.p.make()
    component = cassandra.component(stack.s, stack.p, 1, stack.nodes, stack.log)
    component.prepare()
    yaml = d / "stack" / "conf" / "cassandra.yaml"
    with yaml.open("a") as f:
        f.write(f"""authenticator: PasswordAuthenticator
authorizer: CassandraAuthorizer
client_encryption_options:
  enabled: true
  optional: false
  require_client_auth: true
  ssl_context_factory:
    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory
  keystore: {files["node"]}
  truststore: {files["ca"]}
""")
    with open(d / "node.log", "wb") as log:
        proc = subprocess.Popen(component.start(), stdout=log, stderr=subprocess.STDOUT,
                                env=component.env)
    node = TlsCassandra(port, files)
    try:
        def serving() -> bool:
            assert proc.poll() is None, (d / "node.log").read_text()[-3000:]
            return port_open(port) and can_log_in(node)

        wait_for(serving, timeout=180, interval=1.0, what="the TLS node letting the client in")
        yield node
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_tls_client_with_a_certificate_and_a_password_is_served(
        tls_cassandra: TlsCassandra) -> None:
    cluster, session = connect(tls_cassandra.good(), keyspace=None)
    try:
        row = session.execute("SELECT release_version FROM system.local").one()
        assert row["release_version"].startswith("5.")
        session.execute("CREATE KEYSPACE IF NOT EXISTS tls_check WITH replication = "
                        "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    finally:
        cluster.shutdown()


@pytest.mark.parametrize(("case", "error", "reason"), [
    ("untrusted node", NoHostAvailable, "certificate verify failed"),
    # under TLS 1.3 the node's alert can lose the race with its closing the socket
    ("no client certificate", NoHostAvailable,
     "(?i)certificate required|reset by peer|EOF occurred"),
    ("wrong password", NoHostAvailable, "Bad credentials"),
    ("plaintext", NoHostAvailable, "(?i)reset by peer|closed|timed out|EOF|protocol"),
])
def test_other_clients_are_refused(tls_cassandra: TlsCassandra, case: str,
                                   error: type[Exception], reason: str) -> None:
    settings = {
        "untrusted node": lambda: tls_cassandra.good(ca_file=tls_cassandra.files["stranger"]),
        "no client certificate": lambda: tls_cassandra.good(cert_file=None, key_file=None),
        "wrong password": lambda: tls_cassandra.good(password="not-the-password"),
        "plaintext": lambda: tls_cassandra.settings(username="cassandra",
                                                    password="cassandra"),
    }[case]()
    with pytest.raises(error, match=reason):
        connect(settings, keyspace=None, connect_timeout=3.0)
