"""The local stack without Docker: Kafka (KRaft) and Cassandra 5.0 as plain ``java`` processes
from Maven Central jars, Redis from Debian's ``redis-server``, and SeaweedFS's S3 gateway
(``weed``, built from the Go module proxy), all on loopback: one Kafka broker and one
Cassandra node, or ``up(nodes=3)`` three of each on 127.0.0.1-3 (``ops/cluster.py``).

``up`` is idempotent and waits for health (Kafka metadata lists the broker, CQL answers,
Redis PONGs, S3 answers a signed request), then creates every topic, applies the CQL
migrations and creates the object store's bucket. Jars and ``weed`` are fetched or built once
into ``cache_dir`` (shared between clones); data, logs and pid files live in ``stack_dir``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import tomllib
import uuid
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, cast

from notiflow import tuning
from notiflow.ops import cluster, toxiproxy
from notiflow.settings import Settings

START_TIMEOUT_S = 180.0
GRPC_OFFSET = 10_000
"""SeaweedFS serves each HTTP port's gRPC on that port + 10000 (its default, passed
explicitly): 28333, 29333, 28380, 28888 with the default ports."""
WEED_MODULE = "github.com/seaweedfs/seaweedfs/weed"
_T = TypeVar("_T")


class StackError(RuntimeError):
    """A clear, actionable failure of the local stack."""


@dataclass(frozen=True)
class Paths:
    root: Path
    cache: Path

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def conf(self) -> Path:
        return self.root / "conf"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def libs(self, name: str, version: str) -> Path:
        return self.cache / "libs" / f"{name}-{version}"

    def make(self) -> None:
        for p in (self.logs, self.run, self.conf, self.pids, self.tmp):
            p.mkdir(parents=True, exist_ok=True)


def paths(settings: Settings) -> Paths:
    return Paths(settings.stack_dir.resolve(), settings.cache_dir.expanduser().resolve())


# ---------------------------------------------------------------------------------- helpers


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


STW_THREADS = re.compile(r"^(GC Thread#\d+|VM Thread)$")
"""The JVM threads that do a stop-the-world pause: G1's parallel workers (all started at
launch with ``-XX:-UseDynamicNumberOfGCThreads``) and the VM thread that runs safepoints."""


def prioritise_collector(pid: int, priority: int) -> int:
    """Move JVM ``pid``'s stop-the-world collector threads to ``SCHED_RR`` at ``priority``;
    returns how many. The pause stops every other thread of the JVM, so raising these
    threads takes no CPU from anyone between pauses: under the flood, Cassandra's young
    collections of ~50 MB took 200-380 ms of wall time at the normal priority while the
    P0 processes (real-time) and the flood shared the two cores."""
    moved = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            if STW_THREADS.match(name):
                tuning.to_realtime(int(task.name), priority)
                moved += 1
        except (FileNotFoundError, ProcessLookupError):
            continue
    return moved


def kafka_cluster_id() -> str:
    """A random KRaft cluster id (URL-safe base64 of 16 bytes) that does not start with
    ``-``, which the storage tool would read as an option (as Kafka's own ``Uuid``
    avoids)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def gc_log(path: Path) -> str:
    """JVM flag: every stop-the-world pause (GC and safepoints) with its wall-clock time, so a
    latency stall can be matched with the pauses of the JVM it waited on (``bench/jvm.py``)."""
    return f"-Xlog:gc,safepoint:file={path}:time,uptimemillis:filecount=3,filesize=20m"


def cassandra_tuning() -> dict[str, str]:
    """The Cassandra settings of ``conf/cassandra-tuning.toml`` (name → value as written)."""
    text = (resources.files("notiflow.ops") / "conf" / "cassandra-tuning.toml").read_text()
    return {k: str(v) for k, v in tomllib.loads(text).items()}


def cassandra_tuning_flags() -> list[str]:
    """:func:`cassandra_tuning` as the JVM system properties Cassandra reads its settings
    from (``cassandra.settings.<name>``), for the local stack and docker-compose alike."""
    return ["-Dcassandra.config.allow_system_properties=true",
            *(f"-Dcassandra.settings.{k}={v}" for k, v in cassandra_tuning().items())]


def _java(settings: Settings) -> str:
    home = settings.java_home or (Path(os.environ["JAVA_HOME"]) if "JAVA_HOME" in os.environ
                                  else None)
    java = str(home / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise StackError(
            "Java not found: install OpenJDK 17 (Debian: apt-get install openjdk-17-jre-headless)"
            " or set NOTIFLOW_JAVA_HOME"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    m = re.search(r'version "(\d+)', out)
    major = int(m.group(1)) if m else 0
    if major != 17:
        raise StackError(
            f"{java} is Java {major or '?'}; Cassandra 5.0 needs JDK 17 (Kafka 4 needs >= 17). "
            "Set NOTIFLOW_JAVA_HOME to a JDK 17."
        )
    return java


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(") ", 1)[1][0] != "Z"
    except OSError:
        return True


def _run_async(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coro`` to completion on a fresh event loop in a helper thread (callers may be
    inside a running loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Component:
    name: str
    port: int
    extra_ports: tuple[int, ...]
    start: Callable[[], list[str]]
    healthy: Callable[[], bool]
    prepare: Callable[[], None] = lambda: None
    env: dict[str, str] | None = None
    jvm: bool = False
    after_healthy: Callable[[], None] = lambda: None
    """Idempotent set-up once healthy (also when it was already running)."""
    host: str = "127.0.0.1"
    local_ports: tuple[int, ...] = ()
    """Ports bound on 127.0.0.1 whatever ``host`` is (Cassandra's JMX)."""
    wave: int = 0
    """Components start wave by wave, each once the previous one is healthy (Cassandra's
    seed before the nodes that join it)."""


class Stack:
    """Start, stop and inspect the local Kafka, Cassandra, Redis and SeaweedFS.

    ``object_store=False``: a stack of Kafka, Cassandra and Redis only, which neither builds
    nor starts SeaweedFS (``notiflow demo``: nothing it runs reads or writes the object
    store, and building ``weed`` is the longest step of a fresh clone's set-up). Its
    ``up``, ``down`` and ``status`` leave an S3 gateway started by a full stack alone."""

    def __init__(self, settings: Settings, log: Callable[[str], None] = print,
                 nodes: int | None = None, *, object_store: bool = True) -> None:
        self.p = paths(settings)
        self.nodes = cluster.check_nodes(nodes or self.recorded_nodes() or 1)
        self.s = cluster.cluster_settings(settings, self.nodes)
        self.log = log
        self.object_store = object_store

    def _nodes_file(self) -> Path:
        return self.p.conf / "nodes"

    def recorded_nodes(self) -> int | None:
        """The node count this stack directory's data was made with (None: no data yet)."""
        try:
            return int(self._nodes_file().read_text().strip())
        except (OSError, ValueError):
            return None

    def client_env(self) -> dict[str, str]:
        """The variables every process needs to use this stack (``notiflow stack env``): the
        cluster's shape and, unless configured, the S3 key pair its gateway takes."""
        from notiflow.devenv import object_store_credentials

        env = cluster.client_env(self.s, self.nodes)
        generated = self.p.root / "conf" / "s3-credentials.json"
        if self.s.object_store.access_key_id is None and generated.exists():
            env.update(object_store_credentials(self.p.root))
        return env

    def _name(self, kind: str, node: int) -> str:
        return kind if self.nodes == 1 else f"{kind}-{node}"

    # ------------------------------------------------------------------ jars (Maven Central)

    def fetch(self) -> None:
        """Everything the stack and the test suite run, once (cached in ``cache_dir``): what
        :meth:`fetch_runtime` fetches, and toxiproxy (the proxy of ``notiflow chaos``'s
        network scenarios, which builds it itself when first needed)."""
        self.fetch_runtime()
        toxiproxy.build(self.p.cache, self.log)

    def fetch_runtime(self) -> None:
        """What :meth:`up` starts, once (cached in ``cache_dir``): the Kafka and Cassandra
        jars, and ``weed`` unless the stack leaves the object store out."""
        for name, version in (("kafka", self.s.kafka_version),
                              ("cassandra", self.s.cassandra_version)):
            target = self.p.libs(name, version)
            if (target / ".complete").exists():
                continue
            mvn = shutil.which("mvn")
            if not mvn:
                raise StackError("Maven (mvn) not found: apt-get install maven")
            self.log(f"fetching {name} {version} jars from Maven Central into {target} ...")
            target.mkdir(parents=True, exist_ok=True)
            pom_text = (resources.files("notiflow.ops") / "maven" / f"{name}-pom.xml").read_text()
            pom = target.parent / f"{name}-{version}-pom.xml"
            pom.write_text(pom_text.replace("@VERSION@", version))
            cmd = [mvn, "-B", "-q", "-f", str(pom),
                   "org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies",
                   "-DincludeScope=runtime", f"-DoutputDirectory={target}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise StackError(f"mvn failed for {name}:\n{done.stdout[-3000:]}"
                                 f"{done.stderr[-2000:]}")
            (target / ".complete").write_text(version)
        if self.object_store:
            self._build_weed()

    def weed(self) -> Path:
        """Where the pinned ``weed`` binary lives once built."""
        return self.p.cache / "bin" / f"weed-{self.s.object_store.seaweedfs_version}"

    def _build_weed(self) -> None:
        """Build SeaweedFS's ``weed`` once with the Go toolchain from the Go module proxy, in a
        throw-away module (``ops/go/``: ``go install`` refuses SeaweedFS's module, whose
        go.mod has a replace directive). The Go build cache makes a rebuild quick."""
        target, version = self.weed(), self.s.object_store.seaweedfs_version
        if target.exists():
            return
        go = shutil.which("go")
        if not go:
            raise StackError("the Go toolchain (go, 1.26.6 or newer) is not on PATH: it builds "
                             f"SeaweedFS's weed {version} for the local S3 store")
        self.log(f"building SeaweedFS weed {version} into {target} (once; minutes) ...")
        target.parent.mkdir(parents=True, exist_ok=True)
        src = resources.files("notiflow.ops") / "go"
        with tempfile.TemporaryDirectory(prefix=".weed-build-", dir=target.parent) as tmp:
            (Path(tmp) / "go.mod").write_text((src / "weed-go.mod").read_text())
            (Path(tmp) / "tools.go").write_text((src / "weed-tools.go").read_text())
            built = Path(tmp) / "weed"
            for cmd in ([go, "get", f"{WEED_MODULE}@{version}"],
                        [go, "build", "-o", str(built), WEED_MODULE]):
                done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
                if done.returncode != 0:
                    raise StackError(f"`go {cmd[1]}` of SeaweedFS's weed {version} failed:\n"
                                     f"{done.stderr[-3000:]}")
            built.replace(target)

    # ------------------------------------------------------------------------ components

    def components(self) -> list[Component]:
        nodes = range(1, self.nodes + 1)
        return [self._redis(), *(self._kafka(i) for i in nodes),
                *(self._cassandra(i) for i in nodes),
                *([self._s3()] if self.object_store else [])]

    def _redis(self) -> Component:
        s, p = self.s, self.p
        data = p.run / "redis"

        def start() -> list[str]:
            exe = shutil.which("redis-server")
            if not exe:
                raise StackError("redis-server not found: apt-get install redis-server")
            data.mkdir(parents=True, exist_ok=True)
            return [exe, "--port", str(s.redis_port), "--bind", "127.0.0.1",
                    "--dir", str(data), "--appendonly", "yes", "--appendfsync", "everysec",
                    "--save", "", "--daemonize", "no", "--protected-mode", "yes",
                    "--maxmemory-policy", "noeviction"]

        def healthy() -> bool:
            import redis

            try:
                return bool(redis.Redis(port=s.redis_port, socket_timeout=1).ping())
            except redis.RedisError:
                return False

        return Component("redis", s.redis_port, (), start, healthy)

    def _kafka_cluster_id(self) -> str:
        """The KRaft cluster id every broker of this stack is formatted with (made once)."""
        path = self.p.conf / "kafka-cluster-id"
        if not path.exists():
            path.write_text(kafka_cluster_id())
        return path.read_text().strip()

    def _kafka(self, node: int = 1) -> Component:
        s, p = self.s, self.p
        name = self._name("kafka", node)
        data = p.run / name
        props = p.conf / f"{name}.properties"
        libs = p.libs("kafka", s.kafka_version)
        log4j = resources.files("notiflow.ops") / "conf" / "kafka-log4j2.properties"
        host = cluster.host(node)

        def prepare() -> None:
            props.write_text(cluster.kafka_properties(s, node, self.nodes, data))
            if (data / "meta.properties").exists():
                return
            data.mkdir(parents=True, exist_ok=True)
            cluster_id = self._kafka_cluster_id()
            fmt = subprocess.run(
                [_java(s), f"-Dlog4j2.configurationFile=file:{log4j}", "-cp", f"{libs}/*",
                 "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props),
                 "--ignore-formatted"],
                capture_output=True, text=True,
            )
            if fmt.returncode != 0:
                raise StackError(f"kafka storage format failed:\n{fmt.stdout[-2000:]}"
                                 f"{fmt.stderr[-2000:]}")

        def start() -> list[str]:
            return [_java(s), f"-Xms{s.kafka_heap_mb}m", f"-Xmx{s.kafka_heap_mb}m",
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

        port = cluster.kafka_port(s)
        return Component(name, port, (s.kafka_controller_port,), start, healthy, prepare,
                         jvm=True, host=host)

    def _cassandra(self, node: int = 1) -> Component:
        s, p = self.s, self.p
        name = self._name("cassandra", node)
        data = p.run / name
        yaml = p.conf / f"{name}.yaml"
        host = cluster.host(node)
        logs = p.logs if self.nodes == 1 else p.logs / name
        libs = p.libs("cassandra", s.cassandra_version)
        logback = resources.files("notiflow.ops") / "conf" / "cassandra-logback.xml"

        def prepare() -> None:
            data.mkdir(parents=True, exist_ok=True)
            logs.mkdir(parents=True, exist_ok=True)
            yaml.write_text(f"""cluster_name: 'notiflow'
num_tokens: 1
initial_token: {cluster.initial_token(node, self.nodes)}
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
""")

        def start() -> list[str]:
            jamm = sorted(libs.glob("jamm-*.jar"))
            if not jamm:
                raise StackError(f"jamm jar missing in {libs}: run `notiflow stack fetch`")
            opens = [
                "java.base/java.lang.module", "java.base/jdk.internal.loader",
                "java.base/jdk.internal.ref", "java.base/jdk.internal.reflect",
                "java.base/jdk.internal.math", "java.base/jdk.internal.module",
                "java.base/jdk.internal.util.jar", "jdk.management/com.sun.management.internal",
                "java.base/sun.nio.ch", "java.base/java.io", "java.base/java.lang.reflect",
                "jdk.compiler/com.sun.tools.javac", "java.base/java.lang", "java.base/java.util",
            ]
            exports = [
                "java.base/jdk.internal.misc",
                "java.management.rmi/com.sun.jmx.remote.internal.rmi",
                "java.rmi/sun.rmi.registry", "java.rmi/sun.rmi.server", "java.sql/java.sql",
                "java.base/java.lang.ref", "jdk.unsupported/sun.misc",
                "jdk.compiler/com.sun.tools.javac.file", "jdk.attach/sun.tools.attach",
            ]
            heap = s.cassandra_heap_mb
            return [
                _java(s), f"-Xms{heap}m", f"-Xmx{heap}m", "-Xss256k", "-XX:+UseG1GC",
                "-XX:-UseDynamicNumberOfGCThreads", gc_log(p.logs / f"{name}-gc.log"),
                "-XX:+ExitOnOutOfMemoryError",
                "-XX:+ParallelRefProcEnabled", "-XX:MaxTenuringThreshold=1",
                f"-XX:MaxGCPauseMillis={CASSANDRA_GC_PAUSE_MS}", "-XX:+UseThreadPriorities",
                "-XX:+PerfDisableSharedMem", "-ea", "-da:net.openhft...",
                *([PAXOS_AUTO_REPAIRS_OFF] if self.nodes == 1 else []),
                "-Djava.net.preferIPv4Stack=true", "-Djdk.attach.allowAttachSelf=true",
                *[f"--add-exports={e}=ALL-UNNAMED" for e in exports],
                *[f"--add-opens={o}=ALL-UNNAMED" for o in opens],
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
                *cassandra_tuning_flags(),
                "-cp", f"{libs}/*", "org.apache.cassandra.service.CassandraDaemon",
            ]

        def healthy() -> bool:
            if not port_open(s.cassandra_port, host):
                return False
            return self.cql_nodes_up((host,)) >= 1

        def ring_complete() -> None:
            if node == self.nodes > 1:
                self._wait_ring()

        return Component(name, s.cassandra_port, (s.cassandra_storage_port,), start, healthy,
                         prepare, jvm=True, after_healthy=ring_complete, host=host,
                         local_ports=(cluster.jmx_port(s, node),), wave=int(node > 1))

    def cql_nodes_up(self, hosts: tuple[str, ...]) -> int:
        """How many of the ring's nodes the driver sees up through ``hosts`` (0 when CQL does
        not answer there)."""
        from notiflow.adapters.cassandra_store import connect

        probe = self.s.model_copy(update={"cassandra_hosts": hosts})
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

    def _wait_ring(self) -> None:
        """Until the driver sees every Cassandra node up."""
        hosts = tuple(cluster.host(i) for i in range(1, self.nodes + 1))
        deadline = time.monotonic() + START_TIMEOUT_S
        while (up := self.cql_nodes_up(hosts)) < self.nodes:
            if time.monotonic() > deadline:
                raise StackError(f"cassandra: {up} of {self.nodes} nodes up after "
                                 f"{START_TIMEOUT_S:.0f}s")
            time.sleep(1)
        self.log(f"cassandra: ring of {self.nodes} nodes up")

    def s3_credentials(self) -> tuple[str, str]:
        """The access key id and secret the local S3 gateway accepts: the configured ones, else
        the stack directory's generated pair (``devenv.object_store_credentials``)."""
        o = self.s.object_store
        if o.access_key_id is not None and o.secret_access_key is not None:
            return o.access_key_id.get_secret_value(), o.secret_access_key.get_secret_value()
        from notiflow.devenv import object_store_credentials

        env = object_store_credentials(self.p.root)
        return (env["NOTIFLOW_OBJECT_STORE__ACCESS_KEY_ID"],
                env["NOTIFLOW_OBJECT_STORE__SECRET_ACCESS_KEY"])

    def _s3_probe(self, key: str) -> str:
        """One signed request to the local gateway: ``ok``, ``missing`` (it answered that the
        object or bucket is not there), ``denied`` or ``down``."""
        from datetime import timedelta

        from pydantic import SecretStr

        from notiflow.adapters.object_store import (
            ObjectAccessDenied,
            ObjectNotFound,
            ObjectStore,
            ObjectStoreError,
        )

        o = self.s.object_store
        key_id, secret = self.s3_credentials()
        local = o.model_copy(update={
            "endpoint": f"http://127.0.0.1:{o.s3_port}", "allow_http": True,
            "access_key_id": SecretStr(key_id), "secret_access_key": SecretStr(secret),
            "connect_timeout": timedelta(seconds=2), "timeout": timedelta(seconds=10),
            "max_retries": 0})
        try:
            _run_async(ObjectStore.bucket(o.bucket, local).head(key))
        except ObjectNotFound:
            return "missing"
        except ObjectAccessDenied:
            return "denied"
        except ObjectStoreError:
            return "down"
        return "ok"

    def _s3(self) -> Component:
        """SeaweedFS in one process (master, volume server, filer, S3 gateway), loopback only,
        small volumes; requests must be signed with :meth:`s3_credentials`."""
        p, o = self.p, self.s.object_store
        data = p.run / "seaweedfs"
        identities = p.conf / "s3-identities.json"
        config_dir = p.conf / "seaweedfs"

        def prepare() -> None:
            data.mkdir(parents=True, exist_ok=True)
            config_dir.mkdir(exist_ok=True)
            # weed's default store, with small buffers: 8 partitions x (16 MB memtable +
            # 32 MB block cache) by default made a heap of 250 MB and 320 MB resident
            (config_dir / "filer.toml").write_text(
                f'[leveldb2]\nenabled = true\ndir = "{data / "filerldb2"}"\n'
                "write_buffer_size_mb = 2\nblock_cache_size_mb = 4\n")
            key_id, secret = self.s3_credentials()
            identities.touch(mode=0o600)
            identities.chmod(0o600)
            identities.write_text(json.dumps({"identities": [{
                "name": "notiflow",
                "credentials": [{"accessKey": key_id, "secretKey": secret}],
                "actions": ["Read", "Write", "List", "Tagging"]}]}, indent=2))

        def start() -> list[str]:
            weed = self.weed()
            if not weed.exists():
                raise StackError(f"SeaweedFS's weed {o.seaweedfs_version} is not built: run "
                                 "`notiflow stack fetch` (needs the Go toolchain on PATH)")
            g = GRPC_OFFSET
            return [str(weed), f"-config_dir={config_dir}", "server",
                    "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
                    f"-master.port={o.master_port}", f"-master.port.grpc={o.master_port + g}",
                    "-master.volumeSizeLimitMB=64", "-master.telemetry=false",
                    f"-volume.port={o.volume_port}", f"-volume.port.grpc={o.volume_port + g}",
                    "-volume.max=64", "-volume.preStopSeconds=1",
                    "-filer", f"-filer.port={o.filer_port}",
                    f"-filer.port.grpc={o.filer_port + g}",
                    "-s3", f"-s3.port={o.s3_port}", f"-s3.port.grpc={o.s3_port + g}",
                    f"-s3.config={identities}", "-s3.autoCreateBucket=false",
                    "-s3.port.iceberg=0", "-s3.port.lance=0"]

        def healthy() -> bool:
            return port_open(o.s3_port) and self._s3_probe("notiflow-health") in ("ok",
                                                                                  "missing")

        def create_bucket() -> None:
            shell = subprocess.run(
                [str(self.weed()), "shell", f"-master=127.0.0.1:{o.master_port}",
                 f"-filer=127.0.0.1:{o.filer_port}"],
                input=f"s3.bucket.create -name {o.bucket}\nexit\n", capture_output=True,
                text=True, timeout=120)
            out = shell.stdout + shell.stderr
            if shell.returncode != 0 and "already exists" not in out:
                raise StackError(f"s3: creating bucket {o.bucket} failed:\n{out[-2000:]}")
            self.log(f"s3: bucket {o.bucket} {'ok' if shell.returncode else 'created'}")

        ports = (o.master_port, o.volume_port, o.filer_port)
        return Component("s3", o.s3_port,
                         (*ports, *(port + GRPC_OFFSET for port in (o.s3_port, *ports))),
                         start, healthy, prepare,
                         env={"GOMEMLIMIT": f"{o.memory_limit_mb}MiB"},
                         after_healthy=create_bucket)

    # ---------------------------------------------------------------------- lifecycle

    def _pidfile(self, c: Component) -> Path:
        return self.p.pids / f"{c.name}.pid"

    def pid(self, c: Component) -> int | None:
        f = self._pidfile(c)
        try:
            pid = int(f.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    def up(self, *, topics: bool = True, migrations: bool = True) -> None:
        """Fetch what it runs (:meth:`fetch_runtime`), start what is not running, wave by
        wave, each wave once healthy; then topics, migrations and the bucket. Refuses a node
        count other than the one this stack directory's data was made with."""
        recorded = self.recorded_nodes()
        if recorded is not None and recorded != self.nodes:
            raise StackError(
                f"{self.p.root} holds a {recorded}-node stack, not {self.nodes}: `notiflow "
                "stack down --wipe` first, or use another NOTIFLOW_STACK_DIR")
        self.p.make()
        self.fetch_runtime()
        self._nodes_file().write_text(str(self.nodes))
        comps = self.components()
        for wave in sorted({c.wave for c in comps}):
            now = [c for c in comps if c.wave == wave]
            for c in now:
                self._start(c)
            for c in now:
                self._wait_healthy(c)
                c.after_healthy()
        self._prioritise_collectors()
        self.init(topics=topics, migrations=migrations)

    def _start(self, c: Component) -> None:
        if self.pid(c) is not None:
            self.log(f"{c.name}: already running (pid {self.pid(c)})")
            return
        wanted = [(c.host, port) for port in (c.port, *c.extra_ports)]
        for host, port in [*wanted, *(("127.0.0.1", port) for port in c.local_ports)]:
            if port_open(port, host):
                raise StackError(f"{c.name}: port {port} is already in use on {host} by a "
                                 "process notiflow did not start; stop it or change the port "
                                 "setting")
        c.prepare()
        cmd = c.start()
        log_path = self.p.logs / f"{c.name}.log"
        env = {**os.environ, **c.env} if c.env else None
        with open(log_path, "ab") as log, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(cmd, stdin=devnull, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=self.p.root, env=env)
        self._pidfile(c).write_text(str(proc.pid))
        self.log(f"{c.name}: started (pid {proc.pid}), log {log_path}")

    def init(self, *, topics: bool = True, migrations: bool = True) -> None:
        """Create the topics and apply the migrations (on any reachable stack)."""
        if topics:
            from notiflow.ops.topics import ensure_topics

            created = ensure_topics(self.s)
            self.log(f"kafka: {len(created)} topics created" if created else "kafka: topics ok")
        if migrations:
            self.migrate()

    def migrate(self) -> None:
        from notiflow.adapters.cassandra_store import connect
        from notiflow.ops.migrate import apply

        cluster, session = connect(self.s, keyspace=None)
        try:
            done = apply(session, self.s)
        finally:
            cluster.shutdown()
        names = ", ".join(f"{m.version:04d}_{m.name}" for m in done)
        self.log(f"cassandra: migrations applied: {names}" if done else "cassandra: schema ok")

    def _prioritise_collectors(self) -> None:
        if self.s.jvm_gc_realtime <= 0:
            return
        for c in self.components():
            pid = self.pid(c)
            if not c.jvm or pid is None:
                continue
            try:
                moved = prioritise_collector(pid, self.s.jvm_gc_realtime)
            except PermissionError:
                self.log(f"{c.name}: collector threads stay at normal priority "
                         "(real-time needs CAP_SYS_NICE)")
                return
            self.log(f"{c.name}: {moved} collector threads at real-time priority "
                     f"{self.s.jvm_gc_realtime}")

    def _wait_healthy(self, c: Component) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if c.healthy():
                self.log(f"{c.name}: healthy on {c.host}:{c.port}")
                return
            if self.pid(c) is None:
                raise StackError(f"{c.name} exited during start-up; last log lines:\n"
                                 f"{_tail(self.p.logs / f'{c.name}.log')}")
            time.sleep(0.5)
        raise StackError(f"{c.name} not healthy after {START_TIMEOUT_S:.0f}s; last log lines:\n"
                         f"{_tail(self.p.logs / f'{c.name}.log')}")

    def down(self, *, wipe: bool = False) -> None:
        for c in reversed(self.components()):
            pid = self.pid(c)
            if pid is None:
                self.log(f"{c.name}: not running")
            else:
                stop_process(pid, c.name, self.log)
            self._pidfile(c).unlink(missing_ok=True)
        if wipe:
            shutil.rmtree(self.p.run, ignore_errors=True)
            for made in (self._nodes_file(), self.p.conf / "kafka-cluster-id"):
                made.unlink(missing_ok=True)
            self.log("data wiped")

    def status(self) -> list[tuple[str, int | None, str, bool]]:
        """(component, pid, ``host:port``, healthy) for each component."""
        return [(c.name, self.pid(c), f"{c.host}:{c.port}",
                 self.pid(c) is not None and c.healthy()) for c in self.components()]


def stop_process(pid: int, name: str, log: Callable[[str], None] = print,
                 timeout: float = 30.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``timeout``."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except PermissionError:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.2)
    if _pid_alive(pid):
        log(f"{name}: did not stop in {timeout:.0f}s, killing")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    log(f"{name}: stopped")
