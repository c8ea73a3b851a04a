"""Toxiproxy (Shopify's TCP proxy for simulating network conditions) for ``notiflow chaos``:
the platform reaches a store through it, and a scenario adds latency or a black hole to
that path and takes it away again.

The server is built once from the Go module proxy (``go install``, pinned by
:data:`VERSION`) into the stack's cache, started per scenario on a free loopback port, and
driven over its HTTP API (``/proxies``, ``/proxies/{name}/toxics``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess

MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
VERSION = "v2.5.0"


class ToxiproxyError(RuntimeError):
    pass


def binary(cache: Path) -> Path:
    return cache / "bin" / f"toxiproxy-server-{VERSION}"


def build(cache: Path, log: Any = print) -> Path:
    """The pinned server, built with ``go install`` the first time (seconds to minutes)."""
    target = binary(cache)
    if target.exists():
        return target
    go = shutil.which("go")
    if not go:
        raise ToxiproxyError("the Go toolchain (go) is not on PATH: it builds toxiproxy "
                             f"{VERSION} for the proxy scenarios of `notiflow chaos`")
    log(f"building toxiproxy {VERSION} into {target} (once) ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".toxiproxy-build-", dir=target.parent) as tmp:
        done = subprocess.run([go, "install", f"{MODULE}@{VERSION}"], capture_output=True,
                              text=True, env={**os.environ, "GOBIN": tmp})
        if done.returncode != 0:
            raise ToxiproxyError(f"`go install` of toxiproxy {VERSION} failed:\n"
                                 f"{done.stderr[-3000:]}")
        (Path(tmp) / "server").replace(target)
    return target


@dataclass
class Toxiproxy:
    """A running server and its API."""

    process: ManagedProcess
    api: str

    @classmethod
    def start(cls, cache: Path, log_dir: Path, log: Any = print) -> Toxiproxy:
        port = free_port()
        proc = ManagedProcess("toxiproxy", [], log_dir, dict(os.environ),
                              argv=[str(build(cache, log)), "-host", "127.0.0.1",
                                    "-port", str(port)])
        proc.start()
        api = f"http://127.0.0.1:{port}"
        proc.wait_http(f"{api}/version", timeout=30)
        return cls(proc, api)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        r = httpx.request(method, f"{self.api}{path}", json=body, timeout=10)
        if r.status_code >= 300:
            raise ToxiproxyError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json() if r.content else None

    def proxy(self, name: str, upstream: str, listen: str | None = None) -> str:
        """A proxy to ``upstream`` (``host:port``) on ``listen`` (default: a free loopback
        port); its ``host:port``."""
        listen = listen or f"127.0.0.1:{free_port()}"
        self._call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream,
                                        "enabled": True})
        return listen

    def names(self) -> list[str]:
        """The proxies this server runs."""
        return sorted(self._call("GET", "/proxies"))

    def add(self, proxy: str, toxic: str, kind: str, stream: str = "downstream",
            **attributes: int) -> None:
        """Add ``toxic`` (a toxiproxy toxic ``kind``: ``latency``, ``timeout``, ...) to
        ``proxy``'s ``stream`` (``downstream``: towards the client)."""
        self._call("POST", f"/proxies/{proxy}/toxics", {
            "name": toxic, "type": kind, "stream": stream, "toxicity": 1.0,
            "attributes": attributes})

    def remove(self, proxy: str, toxic: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic}")

    def stop(self) -> None:
        self.process.stop()
