"""The toxiproxy the proxy chaos scenarios run through (``ops/toxiproxy.py``), against the
stack's Redis: through the proxy Redis answers; a latency toxic delays every answer; a
black hole (``timeout`` 0) leaves a command unanswered until the client's timeout; taking
the toxic away lets commands through again."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
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


def assert_slowed_only_by_the_toxic(proxy: Toxiproxy, name: str,
                                    timed: Callable[[], float]) -> None:
    """``timed()`` (seconds of one request through proxy ``name``) is fast once warm, slowed
    by a 300 ms latency toxic, and fast again once the toxic is taken away."""
    timed()
    assert timed() < 0.2
    proxy.add(name, "slow", "latency", latency=300)
    assert timed() >= 0.29
    proxy.remove(name, "slow")
    assert min(timed() for _ in range(3)) < 0.2


def test_a_client_bootstrapped_at_the_proxied_listener_stays_on_the_proxy(
        stack: Settings, proxy: Toxiproxy) -> None:
    """The brokers advertise the proxy's address on their proxied listener, so every
    connection a client opens after bootstrapping goes through the proxy: a latency toxic
    delays its acknowledgements, and taking it away speeds them up again."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    topic = f"toxiproxy-test-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    listen = proxy.proxy("kafka-test", f"127.0.0.1:{stack.kafka_proxied_port}",
                         listen=f"127.0.0.1:{stack.kafka_proxy_port}")
    producer = Producer({"bootstrap.servers": listen, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0})

    def ack_s() -> float:
        done: list[object] = []
        t0 = time.monotonic()
        producer.produce(topic, b"toxiproxy", on_delivery=lambda err, _m: done.append(err))
        while not done:
            producer.poll(0.01)
            assert time.monotonic() - t0 < 20, "no acknowledgement"
        assert done == [None]
        return time.monotonic() - t0

    assert_slowed_only_by_the_toxic(proxy, "kafka-test", ack_s)
    producer.flush(10)
    admin.delete_topics([topic])[topic].result(30)


def test_the_cassandra_driver_stays_on_the_proxy_of_a_one_node_stack(
        stack: Settings, proxy: Toxiproxy) -> None:
    """A one-node stack's driver keeps the contact point it connected through (the proxy)
    for every request; a latency toxic delays them, taking it away speeds them up again."""
    from notiflow.adapters.cassandra.session import connect

    host, port = proxy.proxy("cassandra-test", f"{stack.cassandra_hosts[0]}:"
                                               f"{stack.cassandra_port}").split(":")
    cluster, session = connect(stack.model_copy(update={"cassandra_hosts": (host,),
                                                        "cassandra_port": int(port)}))
    try:
        assert {str(h.endpoint) for h in cluster.metadata.all_hosts()} == {f"{host}:{port}"}

        def query_s() -> float:
            t0 = time.monotonic()
            session.execute("SELECT release_version FROM system.local")
            return time.monotonic() - t0

        assert_slowed_only_by_the_toxic(proxy, "cassandra-test", query_s)
    finally:
        cluster.shutdown()
