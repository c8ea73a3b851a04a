"""A tier as a two-process Bytewax cluster on one host (``-i/-a``, one recovery directory):
SIGKILL one process mid-stream, the other stops with it (Bytewax stops a cluster when a
worker dies), both restart over the same recovery partitions, and every message reaches the
provider."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pytest

from notiflow.devenv import free_port
from notiflow.ops.procs import ManagedProcess, stop_together
from notiflow.schemas.enums import Tier
from notiflow.settings import Settings
from tests.helpers import (
    accepted_counts,
    emulator_records,
    produce,
    report,
    wait_for,
)
from tests.integration.conftest import ready
from tests.integration.test_pipeline import direct, ids_of

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("slow_provider", [1000], indirect=True)
def test_a_two_process_tier_loses_nothing_when_one_process_is_killed(
        isolated, stack: Settings, otp_template: dict[str, int], fakes: str, slow_provider,
        capsys) -> None:
    """P2's provider timeout is 3 s here (10 s by default): the sends in flight at the kill
    are taken over once their leases are twice that old, and the test waits less."""
    p2 = stack.policy(Tier.P2).model_copy(update={"provider_timeout": timedelta(seconds=3)})
    iso = isolated("cluster-p2", NOTIFLOW_TIERS=json.dumps({"P2": p2.model_dump(mode="json")}))
    addresses = f"127.0.0.1:{free_port()};127.0.0.1:{free_port()}"
    recovery = iso.recovery / "send-p2"

    def start(process: int, run: int) -> ManagedProcess:
        return iso.start(f"send-p2-{process}-run{run}", [
            "flow", "send", "--tier", "P2", "-i", str(process), "-a", addresses,
            "--recovery-dir", str(recovery)])

    def started(run: int) -> list[ManagedProcess]:
        procs = [start(0, run), start(1, run)]
        for p in procs:
            p.wait_until(lambda p=p: ready(p), timeout=90)
        return procs

    first = started(1)
    n = 200
    settings = iso.settings
    placed = produce(settings, [direct(settings, Tier.P2, otp_template["acme"])
                                for _ in range(n)])
    ids = ids_of(settings, Tier.P2, placed)
    wanted = set(ids)

    def received() -> int:
        return sum(1 for r in emulator_records(fakes) if r.get("message_id") in wanted)

    wait_for(lambda: received() >= n // 10, what="a tenth of the stream sent")
    first[1].kill()
    at_kill = received()
    assert at_kill < n, "the cluster finished before the kill; raise n or latency"
    wait_for(lambda: not first[0].alive, timeout=60,
             what="the surviving process to stop with its cluster")

    second = started(2)
    wait_for(lambda: all(i in accepted_counts(fakes) for i in ids), timeout=240,
             what="every message provider-accepted after the restart")
    counts = accepted_counts(fakes)
    per_message = Counter(counts.get(i, 0) for i in ids)
    duplicates = sum(c - 1 for c in (counts.get(i, 0) for i in ids) if c > 1)
    report(capsys, f"two-process P2 cluster: {n} produced, {at_kill} sent before one process "
           f"was SIGKILLed, {n - per_message[0]} provider-accepted after the restart, "
           f"{duplicates} duplicate sends")
    assert per_message[0] == 0
    assert duplicates <= 2 * settings.policy(Tier.P2).max_in_flight
    stop_together(second)
