"""Kafka over TLS with SASL through :func:`notiflow.adapters.kafka_io.producer_config`: a
private broker (the stack's Kafka jars, KRaft, one node) whose client listener is
``SASL_SSL`` with a PEM key store from a throw-away ``trustme`` CA, and three mechanisms:
``PLAIN``, ``SCRAM-SHA-512`` (the user created when the storage is formatted) and
``OAUTHBEARER`` (tokens from an OIDC client-credentials endpoint served here, signed with a
key the broker fetches from its JWKS: Kafka's own validator). Each serves a producer and a
consumer configured by ``kafka_security``; a wrong password or client secret, a client
trusting another CA and a plaintext client are refused."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jwt
import pytest
import trustme
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from notiflow.adapters.kafka_io import kafka_config, producer_config
from notiflow.devenv import free_port
from notiflow.ops import cluster
from notiflow.ops.stack import Stack, jvm
from notiflow.ops.stack.kafka import kafka_cluster_id
from notiflow.ops.stack.process import port_open
from notiflow.settings import Settings
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

PASSWORD = uuid.uuid4().hex
CLIENT_SECRET = uuid.uuid4().hex
ISSUER, AUDIENCE = "https://idp.notiflow.test/", "kafka"


class Idp:
    """An OIDC provider for one client (``notiflow``): ``POST /token`` (client credentials,
    HTTP Basic) answers an RS256 JWT; ``GET /jwks`` publishes the public key."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.tokens = 0
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                jwk = {**json.loads(RSAAlgorithm.to_jwk(idp.key.public_key())), "kid": "k1",
                       "use": "sig", "alg": "RS256"}
                self._answer(200, {"keys": [jwk]})

            def do_POST(self) -> None:
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                expected = "Basic " + base64.b64encode(
                    f"notiflow:{CLIENT_SECRET}".encode()).decode()
                if (self.headers.get("Authorization") != expected
                        or form.get("grant_type") != ["client_credentials"]):
                    self._answer(401, {"error": "invalid_client"})
                    return
                idp.tokens += 1
                now = int(time.time())
                token = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": "notiflow",
                                    "iat": now, "exp": now + 300, "scope": "kafka"},
                                   idp.key, algorithm="RS256", headers={"kid": "k1"})
                self._answer(200, {"access_token": token, "token_type": "bearer",
                                   "expires_in": 300})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.jwks, self.token_url = f"{base}/jwks", f"{base}/token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@dataclass(frozen=True)
class TlsKafka:
    port: int
    ca: Path
    stranger_ca: Path
    token_url: str

    def settings(self, **security: Any) -> Settings:
        return Settings(kafka_bootstrap=f"127.0.0.1:{self.port}", kafka_security=security)

    def good(self, **changes: Any) -> Settings:
        return self.settings(**{"protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
                                "sasl_username": "notiflow", "sasl_password": PASSWORD,
                                "ca_file": self.ca, **changes})

    def oauth(self, **changes: Any) -> Settings:
        return self.settings(**{"protocol": "SASL_SSL", "sasl_mechanism": "OAUTHBEARER",
                                "oauth_token_url": self.token_url,
                                "oauth_client_id": "notiflow",
                                "oauth_client_secret": CLIENT_SECRET, "oauth_scope": "kafka",
                                "ca_file": self.ca, **changes})


def properties(d: Path, port: int, inner: int, controller: int, keystore: Path,
               jwks: str) -> str:
    """The stack's broker properties (``ops/cluster.py``), with a plaintext listener for the
    broker itself and a ``SASL_SSL`` one for clients (later keys win)."""
    oauth = "listener.name.clients.oauthbearer."
    base = Settings(kafka_bootstrap=f"127.0.0.1:{inner}", kafka_controller_port=controller)
    jaas = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="notiflow" password="{PASSWORD}" user_notiflow="{PASSWORD}";')
    return cluster.kafka_properties(base, 1, 1, d / "data") + "\n".join([
        f"listeners=PLAINTEXT://127.0.0.1:{inner},CLIENTS://127.0.0.1:{port},"
        f"CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{inner},CLIENTS://127.0.0.1:{port}",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CLIENTS:SASL_SSL,"
        "CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512,OAUTHBEARER",
        f"listener.name.clients.plain.sasl.jaas.config={jaas}",
        "listener.name.clients.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        f"{oauth}sasl.jaas.config="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        f"{oauth}sasl.server.callback.handler.class="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
        f"{oauth}sasl.oauthbearer.jwks.endpoint.url={jwks}",
        f"sasl.oauthbearer.expected.audience={AUDIENCE}",
        f"sasl.oauthbearer.expected.issuer={ISSUER}",
        "ssl.keystore.type=PEM", f"ssl.keystore.location={keystore}", ""])


@pytest.fixture(scope="module")
def idp() -> Iterator[Idp]:
    server = Idp()
    yield server
    server.server.shutdown()


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory: pytest.TempPathFactory, idp: Idp) -> Iterator[TlsKafka]:
    d = tmp_path_factory.mktemp("kafka-tls")
    ca, stranger = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    keystore = d / "broker.pem"
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), None)
    pkcs8 = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())  # what Kafka's PEM store reads
    keystore.write_bytes(pkcs8 + b"".join(b.bytes() for b in server.cert_chain_pems))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    stranger.cert_pem.write_to_path(str(d / "stranger.pem"))
    port, inner, controller = free_port(), free_port(), free_port()
    props = d / "server.properties"
    props.write_text(properties(d, port, inner, controller, keystore, idp.jwks))
    settings = Settings()
    libs = Stack(settings, log=lambda _m: None).p.libs("kafka", settings.kafka_version)
    log4j = resources.files("notiflow.ops") / "conf" / "kafka-log4j2.properties"
    java = [jvm.java(settings), f"-Dlog4j2.configurationFile=file:{log4j}",
            f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={idp.jwks}",
            "-cp", f"{libs}/*"]
    subprocess.run([*java, "kafka.tools.StorageTool", "format", "-t", kafka_cluster_id(),
                    "-c", str(props), "--add-scram",
                    f"SCRAM-SHA-512=[name=notiflow,password={PASSWORD}]"],
                   check=True, capture_output=True)
    with open(d / "broker.log", "wb") as log:
        proc = subprocess.Popen([*java, "-Xmx256m", "kafka.Kafka", str(props)],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        def listening() -> bool:
            assert proc.poll() is None, (d / "broker.log").read_text()[-3000:]
            return port_open(port)

        wait_for(listening, timeout=90, interval=0.2, what="the TLS broker listening")
        yield TlsKafka(port, d / "ca.pem", d / "stranger.pem", idp.token_url)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512", "OAUTHBEARER"])
def test_a_sasl_ssl_client_produces_and_consumes(tls_kafka: TlsKafka, idp: Idp,
                                                 mechanism: str) -> None:
    tokens = idp.tokens
    settings = (tls_kafka.oauth() if mechanism == "OAUTHBEARER"
                else tls_kafka.good(sasl_mechanism=mechanism))
    topic = f"tls-{mechanism.lower()}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(kafka_config(settings))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    producer = Producer(producer_config(settings))
    delivered: list[Any] = []
    producer.produce(topic, b"over tls", on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = Consumer(kafka_config(settings, {"group.id": topic,
                                                "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        msg = None
        while msg is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
        assert msg is not None and msg.error() is None and msg.value() == b"over tls"
    finally:
        consumer.close()
    assert (idp.tokens > tokens) == (mechanism == "OAUTHBEARER")


@pytest.mark.parametrize(("case", "reason"), [
    ("wrong password", "Authentication failed"),
    ("wrong scram password", "Authentication failed"),
    ("wrong client secret", "401|invalid_client|token"),
    ("untrusted server", "certificate verify failed"),
    ("plaintext", "brokers are down|Disconnected|transport failure"),
])
def test_other_clients_are_refused(tls_kafka: TlsKafka, case: str, reason: str) -> None:
    settings = {
        "wrong password": lambda: tls_kafka.good(sasl_password="not-" + PASSWORD),
        "wrong scram password": lambda: tls_kafka.good(sasl_mechanism="SCRAM-SHA-512",
                                                       sasl_password="not-" + PASSWORD),
        "wrong client secret": lambda: tls_kafka.oauth(oauth_client_secret="not-it"),
        "untrusted server": lambda: tls_kafka.good(ca_file=tls_kafka.stranger_ca),
        "plaintext": lambda: tls_kafka.settings(),
    }[case]()
    errors: list[str] = []
    admin = AdminClient(kafka_config(settings, {
        "socket.timeout.ms": 3000, "error_cb": lambda err: errors.append(err.str())}))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(0)
    assert any(re.search(reason, e) for e in errors), errors
