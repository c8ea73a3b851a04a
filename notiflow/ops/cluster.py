"""The shape of a local stack of several Kafka brokers and Cassandra nodes.

Node *i* (1-based) of an *n*-node stack listens on loopback address ``127.0.0.i`` with the
ports of the settings (Kafka ``kafka_bootstrap``'s port and ``kafka_controller_port``,
Cassandra ``cassandra_port`` and ``cassandra_storage_port``); only JMX, which Cassandra binds
to ``127.0.0.1`` whatever its listen address, takes ``cassandra_jmx_port + i - 1``. A broker
also listens on ``kafka_proxied_port`` and advertises ``kafka_proxy_port`` there, where
``notiflow chaos`` puts a proxy between the platform and the brokers. Every
broker is also a KRaft controller (a quorum of *n* voters); Cassandra node 1 is the seed.
One node is the stack notiflow always had; three give every topic and the keyspace three
replicas, ``min.insync.replicas`` 2 and ``LOCAL_QUORUM`` of 2, so that one broker and one
Cassandra node may fail (docs/operations.md, "A three-node stack").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from notiflow.settings import Settings

MAX_NODES: Final = 5
DATA_CENTRE: Final = "datacenter1"
"""The data centre Cassandra's ``SimpleSnitch`` puts every local node in."""


def check_nodes(nodes: int) -> int:
    if not 1 <= nodes <= MAX_NODES:
        raise ValueError(f"a local stack has 1 to {MAX_NODES} nodes, not {nodes}")
    return nodes


def host(node: int) -> str:
    """The loopback address of node ``node`` (1-based)."""
    return f"127.0.0.{node}"


def replicas(nodes: int) -> int:
    """Replicas per topic and per data centre: every node, at most three."""
    return min(3, check_nodes(nodes))


def min_insync(nodes: int) -> int:
    """``min.insync.replicas``: a majority of the replicas (2 of 3, 1 of 1 or 2)."""
    return replicas(nodes) // 2 + 1 if replicas(nodes) > 2 else 1


def kafka_port(settings: Settings) -> int:
    return int(settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)[1])


def bootstrap(settings: Settings, nodes: int) -> str:
    port = kafka_port(settings)
    return ",".join(f"{host(i)}:{port}" for i in range(1, check_nodes(nodes) + 1))


def _overrides(settings: Settings, nodes: int) -> dict[str, Any]:
    """The settings a ``nodes``-node stack changes (none for one node: the defaults are its
    shape)."""
    if check_nodes(nodes) == 1:
        return {}
    return {
        "kafka_bootstrap": bootstrap(settings, nodes),
        "kafka_replication_factor": replicas(nodes),
        "kafka_min_insync_replicas": min_insync(nodes),
        "cassandra_hosts": [host(i) for i in range(1, nodes + 1)],
        "cassandra_replication": {DATA_CENTRE: replicas(nodes)},
        "cassandra_local_dc": DATA_CENTRE,
    }


def client_env(settings: Settings, nodes: int) -> dict[str, str]:
    """:func:`_overrides` as the ``NOTIFLOW_*`` variables with which every process uses the
    ``nodes``-node stack."""
    return {f"NOTIFLOW_{name.upper()}": value if isinstance(value, str) else json.dumps(value)
            for name, value in _overrides(settings, nodes).items()}


def cluster_settings(settings: Settings, nodes: int) -> Settings:
    """``settings`` with :func:`_overrides` applied."""
    changes = _overrides(settings, nodes)
    if not changes:
        return settings
    return settings.model_copy(update={
        **changes, "cassandra_hosts": tuple(changes["cassandra_hosts"])})


def kafka_properties(settings: Settings, node: int, nodes: int, data: Path) -> str:
    """``server.properties`` of broker-and-controller ``node`` of ``nodes``."""
    port, controller = kafka_port(settings), settings.kafka_controller_port
    voters = ",".join(f"{i}@{host(i)}:{controller}" for i in range(1, check_nodes(nodes) + 1))
    rf, isr = replicas(nodes), min_insync(nodes)
    proxied = f"PROXIED://{host(node)}:{settings.kafka_proxied_port}"
    return "\n".join([
        "process.roles=broker,controller",
        f"node.id={node}",
        f"controller.quorum.voters={voters}",
        f"listeners=PLAINTEXT://{host(node)}:{port},CONTROLLER://{host(node)}:{controller},"
        f"{proxied}",
        f"advertised.listeners=PLAINTEXT://{host(node)}:{port},"
        f"PROXIED://{host(node)}:{settings.kafka_proxy_port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
        "PROXIED:PLAINTEXT",
        f"log.dirs={data}",
        "num.partitions=1",
        "auto.create.topics.enable=false",
        f"offsets.topic.replication.factor={rf}",
        "offsets.topic.num.partitions=1",
        f"transaction.state.log.replication.factor={rf}",
        f"transaction.state.log.min.isr={isr}",
        f"share.coordinator.state.topic.replication.factor={rf}",
        f"share.coordinator.state.topic.min.isr={isr}",
        "group.initial.rebalance.delay.ms=0",
        f"min.insync.replicas={isr}",
        f"default.replication.factor={rf}",
        "",
    ])


def initial_token(node: int, nodes: int) -> int:
    """Node ``node``'s one token: the Murmur3 ring split evenly (0 for a single node), so
    every node owns an equal range and none needs to bootstrap by streaming."""
    step = 2**64 // check_nodes(nodes)
    return (node - 1) * step + step // 2 - 2**63


def jmx_port(settings: Settings, node: int) -> int:
    return settings.cassandra_jmx_port + node - 1
