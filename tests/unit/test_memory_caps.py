"""The memory Caps port: the cap rule of ``LocalCaps`` (the reference the Redis script is
tested against), counted once for every port set of the process and safe across threads."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from notiflow.adapters.memory import memory_ports
from notiflow.adapters.memory.caps import LocalCaps, MemoryCaps
from notiflow.adapters.ports import CapCheck, Verdict
from notiflow.schemas.enums import Tier
from tests.helpers import memory_settings

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=10)


def check(member: str, recipient: str = "acme:r1:otp", limit: int | None = 2,
          tenant_cap: int | None = None) -> CapCheck:
    return CapCheck(recipient, member, WINDOW, limit,
                    "acme:2026-12-07" if tenant_cap is not None else None, tenant_cap)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.integers(0, 400)),
                max_size=40))
def test_the_port_answers_like_the_rule(steps: list[tuple[int, int, int]]) -> None:
    """Replays, several recipients, a tenant cap and time moving on: the same verdicts."""
    port, model = MemoryCaps(), LocalCaps()
    at = NOW
    for member, recipient, seconds in steps:
        at += timedelta(seconds=seconds)
        c = check(f"m{member}", f"acme:r{recipient}:otp", tenant_cap=4)
        assert asyncio.run(port.admit([c], at)) == [model.admit(c, at)]


def test_every_port_set_counts_against_one_limit() -> None:
    state, _ = memory_ports(memory_settings(), Tier.P1)
    a, b = state.open(), state.open()
    assert asyncio.run(a.caps.admit([check("m1")], NOW)) == [Verdict.OK]
    assert asyncio.run(b.caps.admit([check("m2"), check("m1"), check("m3")], NOW)) == [
        Verdict.OK, Verdict.OK, Verdict.RECIPIENT]
    later = NOW + WINDOW
    assert asyncio.run(a.caps.admit([check("m3")], later)) == [Verdict.OK]


def test_tenant_cap_refuses_past_the_daily_count() -> None:
    caps = MemoryCaps()
    got = asyncio.run(caps.admit([check(f"m{i}", f"acme:r{i}:mkt", None, tenant_cap=2)
                                  for i in range(3)], NOW))
    assert got == [Verdict.OK, Verdict.OK, Verdict.TENANT]


def test_threads_never_let_more_than_the_limit_through() -> None:
    caps = MemoryCaps()
    got: list[Verdict] = []
    lock = threading.Lock()

    def admit(n: int) -> None:
        verdicts = asyncio.run(caps.admit([check(f"t{n}-{i}", limit=50) for i in range(20)],
                                          NOW))
        with lock:
            got.extend(verdicts)

    threads = [threading.Thread(target=admit, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got.count(Verdict.OK) == 50 and got.count(Verdict.RECIPIENT) == 110
