"""Redis behind Sentinel: a primary, a replica and a sentinel on loopback. notiflow's clients
(``redis+sentinel://``) follow a failover: after the primary is SIGKILLed and the replica
promoted, the same client writes again, and what was replicated before (an idempotency fence)
is still there."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis

from notiflow.adapters.idempotency_fence import Fence, Holder
from notiflow.adapters.redis_pool import redis_client
from notiflow.devenv import free_port
from notiflow.settings import Settings
from tests.helpers import wait_for, wait_until

pytestmark = pytest.mark.integration

SERVICE = "notiflow"


def _serve(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["redis-server", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _answers(port: int) -> bool:
    try:
        return bool(redis.Redis(port=port, socket_timeout=0.5).ping())
    except redis.RedisError:
        return False


class Trio:
    """Primary, replica and sentinel processes."""

    def __init__(self, workdir: Path) -> None:
        self.primary, self.replica, self.sentinel = free_port(), free_port(), free_port()
        base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)]
        self.procs = {
            "primary": _serve(["--port", str(self.primary), *base]),
            "replica": _serve(["--port", str(self.replica), *base,
                               "--replicaof", "127.0.0.1", str(self.primary)]),
        }
        wait_for(lambda: _answers(self.primary) and _answers(self.replica), 10, 0.1, "redis")
        wait_for(self.replica_online, 20, 0.1, "the replica's first sync")
        conf = workdir / "sentinel.conf"
        conf.write_text(f"port {self.sentinel}\nbind 127.0.0.1\ndir {workdir}\n"
                        f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary} 1\n"
                        f"sentinel down-after-milliseconds {SERVICE} 500\n"
                        f"sentinel failover-timeout {SERVICE} 5000\n")
        self.procs["sentinel"] = _serve([str(conf), "--sentinel"])
        wait_for(self.replica_known, 20, 0.1, "the sentinel to see the replica")

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel}/{SERVICE}"

    def replica_online(self) -> bool:
        info = redis.Redis(port=self.primary, socket_timeout=0.5).info("replication")
        replica = info.get("slave0")
        return isinstance(replica, dict) and replica.get("state") == "online"

    def replica_known(self) -> bool:
        try:
            s = redis.Redis(port=self.sentinel, socket_timeout=0.5, decode_responses=True)
            return any(r.get("port") == self.replica or str(r.get("port")) == str(self.replica)
                       for r in s.sentinel_slaves(SERVICE))
        except redis.RedisError:
            return False

    def primary_port(self) -> int:
        s = redis.Redis(port=self.sentinel, socket_timeout=0.5, decode_responses=True)
        return int(s.sentinel_get_master_addr_by_name(SERVICE)[1])

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def trio(tmp_path: Path) -> Iterator[Trio]:
    t = Trio(tmp_path)
    yield t
    t.stop()


async def test_a_client_follows_a_failover_and_keeps_replicated_fences(trio: Trio) -> None:
    client = redis_client(Settings(redis_url=trio.url), timeout=0.5, pool_wait=0.5)
    fence = Fence(client, "t:", timedelta(minutes=5), timeout_s=0.5, down_backoff_s=0.0)
    holder = Holder("h1", "m1")
    try:
        assert await fence.claim("acme", "k1", holder) is None
        # WAIT on a connection of its own (the client's 0.5 s read timeout is shorter than a
        # replica's acknowledgement on a busy machine: CI timed out there once), after a write
        # of its own: WAIT covers the replication offset of the connection's last write
        primary = redis.Redis(port=trio.primary, socket_timeout=15)
        primary.set("synced", "1")
        assert primary.wait(1, 10_000) == 1
        trio.procs["primary"].kill()
        trio.procs["primary"].wait(timeout=10)
        wait_for(lambda: trio.primary_port() == trio.replica, 30, 0.1, "the replica's promotion")

        async def written() -> bool:
            try:
                return bool(await client.set("after", "1"))
            except (redis.RedisError, OSError):
                return False

        await wait_until(written, timeout=15, interval=0.1, what="a write to the new primary")
        assert await client.get("after") == "1"
        assert await fence.claim("acme", "k1", Holder("h2", "m2")) == holder
    finally:
        await client.aclose()
