"""Redis over TLS through :func:`notiflow.adapters.redis_pool.redis_client`: a private
``redis-server`` listening only with TLS and requiring client certificates (a throw-away
``trustme`` CA) serves a ``rediss://`` client that trusts the CA and presents its
certificate; a plain connection, a client trusting another CA and one without a certificate
are refused."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import trustme

from notiflow.adapters.redis_pool import redis_client
from notiflow.devenv import free_port
from notiflow.settings import Settings
from tests.helpers import wait_for


@dataclass(frozen=True)
class TlsRedis:
    port: int
    files: dict[str, Path]

    def settings(self, scheme: str = "rediss", **security: Any) -> Settings:
        return Settings(redis_url=f"{scheme}://127.0.0.1:{self.port}/0",
                        redis_security=security)


def write_pki(d: Path) -> dict[str, Path]:
    ca, stranger = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("notiflow-client")
    files = {name: d / f"{name}.pem" for name in
             ("ca", "stranger_ca", "server", "server_key", "client", "client_key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    stranger.cert_pem.write_to_path(str(files["stranger_ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["server"]))
    server.private_key_pem.write_to_path(str(files["server_key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    files = write_pki(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(files["server"]), "--tls-key-file", str(files["server_key"]),
         "--tls-ca-cert-file", str(files["ca"]), "--tls-auth-clients", "yes",
         "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def up() -> bool:
            assert proc.poll() is None, "redis-server exited (built without TLS?)"
            return listening(port)

        wait_for(up, timeout=10, interval=0.02, what="redis-server listening")
        yield TlsRedis(port, files)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_a_trusted_client_with_its_certificate_is_served(tls_redis: TlsRedis) -> None:
    f = tls_redis.files
    client = redis_client(tls_redis.settings(ca_file=f["ca"], cert_file=f["client"],
                                             key_file=f["client_key"]), timeout=2)
    try:
        await client.set("tls", "yes")
        assert await client.get("tls") == "yes"
    finally:
        await client.aclose()


@pytest.mark.parametrize(("case", "reason"), [
    ("plain", "reset|closed|[Tt]imeout"),
    ("untrusted server", "CERTIFICATE_VERIFY_FAILED"),
    # TLS 1.3 finishes the client's handshake before the server checks for a certificate:
    # the server's alert can lose the race with its closing the socket.
    ("no client certificate", "CERTIFICATE_REQUIRED|reset by peer|closed"),
])
async def test_other_connections_are_refused(tls_redis: TlsRedis, case: str,
                                             reason: str) -> None:
    f = tls_redis.files
    mine = {"cert_file": f["client"], "key_file": f["client_key"]}
    settings = {
        "plain": lambda: tls_redis.settings("redis"),
        "untrusted server": lambda: tls_redis.settings(ca_file=f["stranger_ca"], **mine),
        "no client certificate": lambda: tls_redis.settings(ca_file=f["ca"]),
    }[case]()
    client = redis_client(settings, timeout=1, pool_wait=1)
    try:
        with pytest.raises((redis.ConnectionError, redis.TimeoutError), match=reason):
            await client.ping()
    finally:
        await client.aclose()
