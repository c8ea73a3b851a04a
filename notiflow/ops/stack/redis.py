"""Redis: Debian's ``redis-server`` on loopback, append-only, never evicting."""

from __future__ import annotations

import shutil

from notiflow.ops.stack.base import Component, Paths, StackError
from notiflow.settings import Settings


def component(s: Settings, p: Paths) -> Component:
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
