"""The local stack as a whole (:class:`Stack`): its components in start order, ``up``,
``down``, ``status``, ``init`` and the environment that points processes at it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Collection
from pathlib import Path

from notiflow.ops import cluster, toxiproxy
from notiflow.ops.stack import cassandra, kafka, maven, redis, s3
from notiflow.ops.stack.base import START_TIMEOUT_S, Component, StackError, paths
from notiflow.ops.stack.jvm import prioritise_collector
from notiflow.ops.stack.process import pid_alive, port_open, stop_process, tail
from notiflow.settings import Settings


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

    def fetch(self) -> None:
        """Everything the stack and the test suite run, once (cached in ``cache_dir``): what
        :meth:`fetch_runtime` fetches, and toxiproxy (the proxy of ``notiflow chaos``'s
        network scenarios, which builds it itself when first needed)."""
        self.fetch_runtime()
        toxiproxy.build(self.p.cache, self.log)

    def fetch_runtime(self) -> None:
        """What :meth:`up` starts, once (cached in ``cache_dir``): the Kafka and Cassandra
        jars, and ``weed`` unless the stack leaves the object store out."""
        maven.fetch_jars(self.s, self.p, self.log)
        if self.object_store:
            s3.build_weed(self.s, self.p, self.log)

    def components(self) -> list[Component]:
        """Every component in start order: Redis, the Kafka brokers, the Cassandra nodes,
        then the object store (unless left out)."""
        nodes = range(1, self.nodes + 1)
        return [redis.component(self.s, self.p),
                *(kafka.component(self.s, self.p, i, self.nodes) for i in nodes),
                *(cassandra.component(self.s, self.p, i, self.nodes, self.log) for i in nodes),
                *([s3.component(self.s, self.p, self.log)] if self.object_store else [])]

    def _pidfile(self, c: Component) -> Path:
        return self.p.pids / f"{c.name}.pid"

    def pid(self, c: Component) -> int | None:
        f = self._pidfile(c)
        try:
            pid = int(f.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

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

    def start(self, names: Collection[str]) -> None:
        """Start the components ``names`` that are not running and wait until each is
        healthy, leaving the others alone (no topics, migrations or bucket); a test's private
        broker, or one restarted after an outage."""
        comps = [c for c in self.components() if c.name in names]
        missing = set(names) - {c.name for c in comps}
        if missing:
            raise StackError(f"no such component: {', '.join(sorted(missing))}")
        self.p.make()
        for c in comps:
            self._start(c)
        for c in comps:
            self._wait_healthy(c)
            c.after_healthy()

    def _start(self, c: Component) -> None:
        if self.pid(c) is not None:
            self.log(f"{c.name}: already running (pid {self.pid(c)})")
            return
        wanted = [(c.host, port) for port in (c.port, *c.extra_ports)]
        for host, port in [*wanted, *(("127.0.0.1", port) for port in c.local_ports)]:
            if port_open(port, host):
                raise StackError(
                    f"{c.name}: port {port} is already in use on {host} by a process this "
                    f"stack directory ({self.p.root}) did not start; stop it or change the "
                    "port setting, or, if it is the stack of another checkout, use it by "
                    "setting NOTIFLOW_STACK_DIR to that checkout's stack directory")
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
        from notiflow.adapters.cassandra.session import connect
        from notiflow.ops.migrate import apply

        conn, session = connect(self.s, keyspace=None)
        try:
            done = apply(session, self.s)
        finally:
            conn.shutdown()
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
                                 f"{tail(self.p.logs / f'{c.name}.log')}")
            time.sleep(0.5)
        raise StackError(f"{c.name} not healthy after {START_TIMEOUT_S:.0f}s; last log lines:\n"
                         f"{tail(self.p.logs / f'{c.name}.log')}")

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
