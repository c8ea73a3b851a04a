"""Every Kafka, Cassandra and Redis client of the ``notiflow`` package is built by its store's
one builder (``kafka_io.kafka_config``, ``cassandra.session.connect``,
``redis_pool.redis_client``), so none misses the transport security of the settings. Checked
on the source: a client configured anywhere else fails here."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "notiflow"

KAFKA_BUILDER = "adapters/kafka_io.py"
CASSANDRA_BUILDER = "adapters/cassandra/session.py"
REDIS_BUILDER = "adapters/redis_pool.py"
BYTEWAX_KAFKA = "adapters/bytewax_kafka.py"

REDIS_CONSTRUCTORS = frozenset({"Redis", "StrictRedis", "RedisCluster", "Sentinel",
                                "from_url", "ConnectionPool", "BlockingConnectionPool"})
REDIS_EXEMPT = {"ops/stack/redis.py": "probes the local stack's own plaintext redis-server by port"}


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else None)


def test_only_the_kafka_builder_names_bootstrap_servers() -> None:
    """A Kafka client config needs ``bootstrap.servers``; only :func:`kafka_config` sets it
    (in a dict or by assignment), so every config is one of its."""
    found = []
    for name, tree in modules():
        for node in ast.walk(tree):
            keys: list[ast.expr | None] = []
            if isinstance(node, ast.Dict):
                keys = list(node.keys)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                keys = [node.slice]
            elif isinstance(node, ast.Call) and called_name(node) in ("dict", "update"):
                keys = [ast.Constant(k.arg) for k in node.keywords]
            if any(isinstance(k, ast.Constant) and k.value == "bootstrap.servers"
                   for k in keys):
                found.append(f"{name}:{node.lineno}")
    assert {f.split(":")[0] for f in found} == {KAFKA_BUILDER}, found


def test_bytewax_kafka_sources_and_sinks_only_in_their_adapter() -> None:
    """Bytewax's Kafka sources, sinks and operators build their own clients: only
    ``kafka_source`` may, with :func:`kafka_config` (its message types are free to use)."""
    users = set()
    for name, tree in modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom | ast.Import):
                continue
            module = node.module or "" if isinstance(node, ast.ImportFrom) else ""
            imported = {f"{module}.{a.name}".strip(".") for a in node.names}
            if any(i.startswith("bytewax.connectors.kafka") and (
                    i.endswith(("KafkaSource", "KafkaSink")) or ".operators" in i)
                   for i in imported):
                users.add(name)
    assert users == {BYTEWAX_KAFKA}


def test_only_connect_builds_a_cassandra_cluster() -> None:
    builders = {name for name, tree in modules() for node in ast.walk(tree)
                if isinstance(node, ast.Call) and called_name(node) == "Cluster"}
    assert builders == {CASSANDRA_BUILDER}


def test_only_redis_client_builds_a_redis_client() -> None:
    builders = {name for name, tree in modules() for node in ast.walk(tree)
                if isinstance(node, ast.Call) and called_name(node) in REDIS_CONSTRUCTORS}
    assert builders - REDIS_EXEMPT.keys() == {REDIS_BUILDER}
