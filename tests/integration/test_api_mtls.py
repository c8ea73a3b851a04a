"""The API over HTTPS with client certificates required (``NOTIFLOW_API_TLS__*``): the real
``notiflow api`` with a certificate from a throw-away CA (trustme); clients that present a
certificate of that CA are served, clients without one or with another CA's are refused at
the handshake; the bearer token still decides who the caller is."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from notiflow.devenv import free_port

pytestmark = pytest.mark.integration


def client(ca: Path, cert: tuple[Path, Path] | None = None) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    return httpx.Client(verify=context, timeout=10)


def test_mutual_tls_admits_only_clients_of_the_configured_ca(
        isolated: Callable[..., Any], tmp_path: Path, tokens: dict[str, str]) -> None:
    ca, stranger = trustme.CA(), trustme.CA()
    files = {n: tmp_path / f"{n}.pem" for n in ("ca", "server", "server_key", "client",
                                                  "client_key", "other", "other_key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_and_cert_chain_pem.write_to_path(str(files["server"]))
    server.private_key_pem.write_to_path(str(files["server_key"]))
    ours, theirs = ca.issue_cert("svc-checkout"), stranger.issue_cert("svc-checkout")
    for leaf, cert, key in ((ours, "client", "client_key"), (theirs, "other", "other_key")):
        leaf.cert_chain_pems[0].write_to_path(str(files[cert]))
        leaf.private_key_pem.write_to_path(str(files[key]))

    port = free_port()
    iso = isolated(f"mtls{uuid.uuid4().hex[:6]}", NOTIFLOW_API_PORT=str(port),
                   NOTIFLOW_API_TLS__CERT_FILE=str(files["server"]),
                   NOTIFLOW_API_TLS__KEY_FILE=str(files["server_key"]),
                   NOTIFLOW_API_TLS__CLIENT_CA_FILE=str(files["ca"]),
                   NOTIFLOW_API_TLS__CLIENT_CERTS="required")
    base = f"https://127.0.0.1:{port}"
    good = client(files["ca"], (files["client"], files["client_key"]))

    def up() -> bool:
        try:
            return good.get(f"{base}/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    iso.start("api", ["api"]).wait_until(up, timeout=60)

    r = good.get(f"{base}/v1/messages/{uuid.uuid4().hex}",
                 headers={"Authorization": f"Bearer {tokens['acme']}"})
    assert r.status_code == 404
    r = good.get(f"{base}/v1/messages/{uuid.uuid4().hex}",
                 headers={"Authorization": "Bearer wrong"})
    assert (r.status_code, r.json()["reason"]) == (401, "unknown_token")

    for refused in (client(files["ca"]),
                    client(files["ca"], (files["other"], files["other_key"]))):
        with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
            refused.get(f"{base}/healthz")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
