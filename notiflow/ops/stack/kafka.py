"""Kafka: one KRaft broker per node (broker and controller in one process), formatted once
with the stack's cluster id."""

from __future__ import annotations

import base64
import subprocess
import uuid
from importlib import resources

from notiflow.ops import cluster
from notiflow.ops.stack.base import Component, Paths, StackError, component_name
from notiflow.ops.stack.jvm import gc_log, java
from notiflow.ops.stack.process import port_open
from notiflow.settings import Settings


def kafka_cluster_id() -> str:
    """A random KRaft cluster id (URL-safe base64 of 16 bytes) that does not start with
    ``-``, which the storage tool would read as an option (as Kafka's own ``Uuid``
    avoids)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def stack_cluster_id(p: Paths) -> str:
    """The KRaft cluster id every broker of this stack is formatted with (made once, kept in
    ``conf/kafka-cluster-id``)."""
    path = p.conf / "kafka-cluster-id"
    if not path.exists():
        path.write_text(kafka_cluster_id())
    return path.read_text().strip()


def component(s: Settings, p: Paths, node: int, nodes: int) -> Component:
    name = component_name("kafka", node, nodes)
    data = p.run / name
    props = p.conf / f"{name}.properties"
    libs = p.libs("kafka", s.kafka_version)
    log4j = resources.files("notiflow.ops") / "conf" / "kafka-log4j2.properties"
    host = cluster.host(node)
    port = cluster.kafka_port(s)

    def prepare() -> None:
        props.write_text(cluster.kafka_properties(s, node, nodes, data))
        if (data / "meta.properties").exists():
            return
        data.mkdir(parents=True, exist_ok=True)
        cluster_id = stack_cluster_id(p)
        fmt = subprocess.run(
            [java(s), f"-Dlog4j2.configurationFile=file:{log4j}", "-cp", f"{libs}/*",
             "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
             "--ignore-formatted"],
            capture_output=True, text=True,
        )
        if fmt.returncode != 0:
            raise StackError(f"kafka storage format failed:\n{fmt.stdout[-2000:]}"
                             f"{fmt.stderr[-2000:]}")

    def start() -> list[str]:
        return [java(s), f"-Xms{s.kafka_heap_mb}m", f"-Xmx{s.kafka_heap_mb}m",
                "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:-UseDynamicNumberOfGCThreads",
                gc_log(p.logs / f"{name}-gc.log"),
                "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                "-Djava.awt.headless=true", f"-Djava.io.tmpdir={p.tmp}",
                f"-Dlog4j2.configurationFile=file:{log4j}",
                "-cp", f"{libs}/*", "kafka.Kafka", str(props)]

    def healthy() -> bool:
        import logging

        from confluent_kafka.admin import AdminClient

        from notiflow.adapters.kafka_io import kafka_config

        if not port_open(port, host):
            return False
        quiet = logging.getLogger("notiflow.stack.kafka-probe")
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        probe = s.model_copy(update={"kafka_bootstrap": f"{host}:{port}"})
        try:
            md = AdminClient(kafka_config(probe, {"socket.timeout.ms": 2000}), logger=quiet
                             ).list_topics(timeout=2)
        except Exception:
            return False
        return node in md.brokers

    return Component(name, port, (s.kafka_controller_port,), start, healthy, prepare,
                     jvm=True, host=host)
