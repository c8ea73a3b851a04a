"""What every part of the local stack shares: its error, its directories and the description
of one component."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from notiflow.settings import Settings

START_TIMEOUT_S = 180.0


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


def component_name(kind: str, node: int, nodes: int) -> str:
    """``kind`` in a one-node stack, ``kind-node`` in a stack of several: the name of its
    pid file, log, data and configuration."""
    return kind if nodes == 1 else f"{kind}-{node}"


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
