"""The toxiproxy the proxy chaos scenarios run through (``ops/toxiproxy.py``), against the
stack's Redis: through the proxy Redis answers; a latency toxic delays every answer; a
black hole (``timeout`` 0) leaves a command unanswered until the client's timeout; taking
the toxic away lets commands through again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from notiflow.ops.toxiproxy import Toxiproxy
from notiflow.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def proxy(stack: Settings, log_dir: Path) -> Iterator[Toxiproxy]:
    tp = Toxiproxy.start(stack.cache_dir.expanduser(), log_dir / "toxiproxy",
                         log=lambda _m: None)
    yield tp
    tp.stop()


def test_latency_and_a_black_hole_on_the_path_to_redis(stack: Settings,
                                                       proxy: Toxiproxy) -> None:
    url = urlsplit(stack.redis_url)
    host, port = proxy.proxy("redis-test", f"{url.hostname}:{url.port}").split(":")
    client = redis.Redis(host=host, port=int(port), socket_timeout=0.5)

    def ping_s() -> float:
        t0 = time.monotonic()
        assert client.ping()
        return time.monotonic() - t0

    assert ping_s() < 0.2
    proxy.add("redis-test", "slow", "latency", latency=300)
    assert ping_s() >= 0.29
    proxy.remove("redis-test", "slow")
    assert ping_s() < 0.2
    proxy.add("redis-test", "hole", "timeout", "upstream", timeout=0)
    t0 = time.monotonic()
    with pytest.raises(redis.exceptions.TimeoutError):
        client.ping()
    assert time.monotonic() - t0 >= 0.45
    proxy.remove("redis-test", "hole")
    client.connection_pool.disconnect()
    assert ping_s() < 0.2
