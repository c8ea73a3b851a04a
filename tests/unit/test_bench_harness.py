"""The benchmark harness's polling of the emulators: it must not cost the pipeline it measures
(a client per call built an SSL context each time: 30 ms of CPU per call)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from notiflow.bench.harness import PROVIDERS, Phase


class _Stats(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peers: set[tuple[str, int]] = set()

    def do_GET(self) -> None:
        type(self).peers.add(self.client_address)
        body = json.dumps({"accepted": 2, "accepted_with_prefix": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def emulators() -> Iterator[str]:
    _Stats.peers = set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stats)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_progress_polls_share_one_connection(emulators: str, tmp_path: Path) -> None:
    phase = Phase("unit", tmp_path, "abc123")
    phase.fakes = emulators
    try:
        for _ in range(3):
            assert phase.accepted_count("msg_") == len(PROVIDERS)
            assert phase.accepted_count() == 2 * len(PROVIDERS)
    finally:
        phase.admin.close()
    assert len(_Stats.peers) == 1
