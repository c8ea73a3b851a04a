"""Cassandra 5.0: one node per host address, the first the seed of the others, tuned by
``conf/cassandra-tuning.toml``."""

from __future__ import annotations

import time
import tomllib
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, cast

from notiflow.ops import cluster
from notiflow.ops.stack.base import (
    START_TIMEOUT_S,
    Component,
    Paths,
    StackError,
    component_name,
)
from notiflow.ops.stack.jvm import gc_log, java
from notiflow.ops.stack.process import port_open
from notiflow.settings import Settings

CASSANDRA_GC_PAUSE_MS = 50
"""G1's pause goal for the local Cassandra (Cassandra ships 300 ms): every P0 acceptance
waits on Cassandra, and under the flood its young collections took up to 520 ms."""


PAXOS_AUTO_REPAIRS_OFF = "-Dcassandra.disable_paxos_auto_repairs=true"
"""The local stack is one node. Paxos v2 repairs every table's uncommitted rounds across its
replicas every five minutes; with one replica there is nothing to reconcile (the next
lightweight transaction or serial read of a partition finishes a round left uncommitted),
yet after a load of idempotency LWTs the repair and its ``system.paxos`` flushes came right
when P0 ran at half load (``docs/decisions/2026-12-04-paxos-auto-repair-off.md``). A
multi-node cluster (``docker-compose.yml``, the Helm chart) keeps the repairs."""

OPENS = [
    "java.base/java.lang.module", "java.base/jdk.internal.loader",
    "java.base/jdk.internal.ref", "java.base/jdk.internal.reflect",
    "java.base/jdk.internal.math", "java.base/jdk.internal.module",
    "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal",
    "java.base/sun.nio.ch", "java.base/java.io", "java.base/java.lang.reflect",
    "jdk.compiler/com.sun.tools.javac", "java.base/java.lang", "java.base/java.util",
]
EXPORTS = [
    "java.base/jdk.internal.misc",
    "java.management.rmi/com.sun.jmx.remote.internal.rmi",
    "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql",
    "java.base/java.lang.ref", "jdk.unsupported/sun.misc",
    "jdk.compiler/com.sun.tools.javac.file", "jdk.attach/sun.tools.attach",
]


def cassandra_tuning() -> dict[str, str]:
    """The Cassandra settings of ``conf/cassandra-tuning.toml`` (name → value as written)."""
    text = (resources.files("notiflow.ops") / "conf" / "cassandra-tuning.toml").read_text()
    return {k: str(v) for k, v in tomllib.loads(text).items()}


def cassandra_tuning_flags() -> list[str]:
    """:func:`cassandra_tuning` as the JVM system properties Cassandra reads its settings
    from (``cassandra.settings.<name>``), for the local stack and docker-compose alike."""
    return ["-Dcassandra.config.allow_system_properties=true",
            *(f"-Dcassandra.settings.{k}={v}" for k, v in cassandra_tuning().items())]


def node_yaml(s: Settings, node: int, nodes: int, data: Path) -> str:
    """``cassandra.yaml`` of ``node`` of ``nodes``: one token of an evenly split ring, its own
    host address, node 1 the seed, everything it stores under ``data``."""
    host = cluster.host(node)
    return f"""cluster_name: 'notiflow'
num_tokens: 1
initial_token: {cluster.initial_token(node, nodes)}
auto_bootstrap: false
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
listen_address: {host}
rpc_address: {host}
storage_port: {s.cassandra_storage_port}
native_transport_port: {s.cassandra_port}
start_native_transport: true
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters: [{{seeds: "{cluster.host(1)}"}}]
data_file_directories: [{data}/data]
commitlog_directory: {data}/commitlog
saved_caches_directory: {data}/saved_caches
hints_directory: {data}/hints
"""


def cql_nodes_up(s: Settings, hosts: tuple[str, ...]) -> int:
    """How many of the ring's nodes the driver sees up through ``hosts`` (0 when CQL does
    not answer there)."""
    from notiflow.adapters.cassandra.session import connect

    probe = s.model_copy(update={"cassandra_hosts": hosts})
    try:
        conn, session = connect(probe, keyspace=None, connect_timeout=3)
    except Exception:
        return 0
    try:
        if session.execute("SELECT release_version FROM system.local").one() is None:
            return 0
        known: list[Any] = cast(Any, conn).metadata.all_hosts()
        return len([h for h in known if h.is_up])
    except Exception:
        return 0
    finally:
        conn.shutdown()


def wait_ring(s: Settings, nodes: int, log: Callable[[str], None]) -> None:
    """Until the driver sees every Cassandra node up."""
    hosts = tuple(cluster.host(i) for i in range(1, nodes + 1))
    deadline = time.monotonic() + START_TIMEOUT_S
    while (up := cql_nodes_up(s, hosts)) < nodes:
        if time.monotonic() > deadline:
            raise StackError(f"cassandra: {up} of {nodes} nodes up after "
                             f"{START_TIMEOUT_S:.0f}s")
        time.sleep(1)
    log(f"cassandra: ring of {nodes} nodes up")


def component(s: Settings, p: Paths, node: int, nodes: int,
              log: Callable[[str], None]) -> Component:
    name = component_name("cassandra", node, nodes)
    data = p.run / name
    yaml = p.conf / f"{name}.yaml"
    host = cluster.host(node)
    logs = p.logs if nodes == 1 else p.logs / name
    libs = p.libs("cassandra", s.cassandra_version)
    logback = resources.files("notiflow.ops") / "conf" / "cassandra-logback.xml"

    def prepare() -> None:
        data.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        yaml.write_text(node_yaml(s, node, nodes, data))

    def start() -> list[str]:
        jamm = sorted(libs.glob("jamm-*.jar"))
        if not jamm:
            raise StackError(f"jamm jar missing in {libs}: run `notiflow stack fetch`")
        heap = s.cassandra_heap_mb
        return [
            java(s), f"-Xms{heap}m", f"-Xmx{heap}m", "-Xss256k", "-XX:+UseG1GC",
            "-XX:-UseDynamicNumberOfGCThreads", gc_log(p.logs / f"{name}-gc.log"),
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1",
            f"-XX:MaxGCPauseMillis={CASSANDRA_GC_PAUSE_MS}", "-XX:+UseThreadPriorities",
            "-XX:+PerfDisableSharedMem", "-ea", "-da:net.openhft...",
            *([PAXOS_AUTO_REPAIRS_OFF] if nodes == 1 else []),
            "-Djava.net.preferIPv4Stack=true", "-Djdk.attach.allowAttachSelf=true",
            *[f"--add-exports={e}=ALL-UNNAMED" for e in EXPORTS],
            *[f"--add-opens={o}=ALL-UNNAMED" for o in OPENS],
            "-Dio.netty.tryReflectionSetAccessible=true",
            "-Dio.netty.allocator.useCacheForAllThreads=true",
            "-Dio.netty.allocator.maxOrder=11",
            f"-Djava.io.tmpdir={p.tmp}", f"-Djna.tmpdir={p.tmp}",
            f"-Dio.netty.native.workdir={p.tmp}",
            f"-javaagent:{jamm[-1]}",
            "-Dcassandra-foreground=yes",
            f"-Dcassandra.config=file://{yaml}",
            f"-Dcassandra.storagedir={data}",
            f"-Dcassandra.logdir={logs}",
            f"-Dlogback.configurationFile=file://{logback}",
            f"-Dcassandra.jmx.local.port={cluster.jmx_port(s, node)}",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            *([] if s.cassandra_flush_schema
              else ["-Dcassandra.test.flush_local_schema_changes=false"]),
            *cassandra_tuning_flags(),
            "-cp", f"{libs}/*", "org.apache.cassandra.service.CassandraDaemon",
        ]

    def healthy() -> bool:
        if not port_open(s.cassandra_port, host):
            return False
        return cql_nodes_up(s, (host,)) >= 1

    def ring_complete() -> None:
        if node == nodes > 1:
            wait_ring(s, nodes, log)

    return Component(name, s.cassandra_port, (s.cassandra_storage_port,), start, healthy,
                     prepare, jvm=True, after_healthy=ring_complete, host=host,
                     local_ports=(cluster.jmx_port(s, node),), wave=int(node > 1))
