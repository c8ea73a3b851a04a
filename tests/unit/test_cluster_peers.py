"""A Bytewax cluster's members from a StatefulSet's DNS names (adapters/cluster_peers.py)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from notiflow.adapters.cluster_peers import (
    ClusterSpec,
    PeersError,
    SizeWatch,
    count_members,
    dns_resolves,
    settle_size,
    spec_from_hostname,
    watch_size,
)
from notiflow.flows.common.runner import membership
from notiflow.settings import Settings
from tests.fakes import SleepingClock

DOMAIN = "send-p1.notiflow.svc.cluster.local"


def spec(ordinal: int = 0, max_size: int = 8) -> ClusterSpec:
    return ClusterSpec("send-p1", ordinal, DOMAIN, 2101, max_size)


def pods(*ordinals: int) -> set[str]:
    return {f"send-p1-{i}.{DOMAIN}" for i in ordinals}


def test_the_pod_name_gives_set_and_ordinal() -> None:
    s = spec_from_hostname("send-p1-3", DOMAIN + ".", 2101, 4)
    assert (s.set_name, s.ordinal, s.service_domain) == ("send-p1", 3, DOMAIN)
    assert s.addresses(2) == [f"send-p1-0.{DOMAIN}:2101", f"send-p1-1.{DOMAIN}:2101"]
    assert spec_from_hostname(f"reconcile-0.{DOMAIN}", DOMAIN, 2101, 4).set_name == "reconcile"


@pytest.mark.parametrize("hostname", ["sendp1", "send-p1-", "Send-P1-0", "-1"])
def test_a_name_without_an_ordinal_is_refused(hostname: str) -> None:
    with pytest.raises(PeersError, match="StatefulSet pod name"):
        spec_from_hostname(hostname, DOMAIN, 2101, 4)


def test_an_ordinal_beyond_the_recovery_partitions_is_refused() -> None:
    with pytest.raises(PeersError, match="recovery partitions"):
        spec_from_hostname("send-p1-4", DOMAIN, 2101, 4)


def test_members_are_counted_up_to_the_first_gap_and_the_maximum() -> None:
    assert count_members(spec(), pods(0, 1, 3).__contains__) == 2
    assert count_members(spec(), set().__contains__) == 0
    assert count_members(spec(max_size=3), pods(0, 1, 2, 3, 4).__contains__) == 3


def test_a_member_starts_once_the_count_includes_it_and_has_held() -> None:
    t = SleepingClock()
    seen = [pods(0), pods(0), pods(0, 1), pods(0, 1, 2)]  # then 0..2 for good

    def resolves(host: str) -> bool:
        i = min(int(t.now // 5), len(seen) - 1)
        return host in seen[i]

    size = settle_size(spec(ordinal=1), resolves, settle=20, interval=5, clock=t,
                       sleep=t.sleep)
    assert size == 3
    assert t.now >= 15 + 20


def test_a_steady_count_starts_after_the_settle_time() -> None:
    t = SleepingClock()
    assert settle_size(spec(), pods(0, 1).__contains__, settle=20, interval=5,
                       clock=t, sleep=t.sleep) == 2
    assert t.now == 20


@given(st.lists(st.integers(0, 4), max_size=30))
def test_a_restart_needs_the_change_twice_in_a_row(counts: list[int]) -> None:
    watch = SizeWatch(2)
    decisions = [watch.observe(c) for c in counts]
    first = next((i for i, d in enumerate(decisions) if d), None)
    expected = next((i for i in range(1, len(counts))
                     if counts[i] != 2 and counts[i - 1] != 2), None)
    assert first == expected


def test_the_watcher_stops_the_process_when_the_set_is_rescaled() -> None:
    members = pods(0, 1)
    changed = threading.Event()
    stop = threading.Event()
    thread = watch_size(spec(), 2, members.__contains__, interval=0.01, stop=stop,
                        on_change=changed.set)
    assert not changed.wait(0.1)
    members |= pods(2)
    assert changed.wait(5)
    thread.join(5)
    stop.set()


def test_the_watcher_ends_quietly_when_the_flow_stops() -> None:
    changed, stop = threading.Event(), threading.Event()
    thread = watch_size(spec(), 1, pods(0).__contains__, interval=0.01, stop=stop,
                        on_change=changed.set)
    stop.set()
    thread.join(5)
    assert not thread.is_alive() and not changed.is_set()


def test_dns_resolution() -> None:
    assert dns_resolves("localhost")
    assert not dns_resolves("no-such-pod-0.notiflow.invalid")


def test_membership_without_dns_is_what_was_given() -> None:
    m = membership(Settings(), 1, "a:1;b:2", None, 2101)
    assert (m.process_id, m.addresses, m.workers, m.spec) == (1, "a:1;b:2", 2, None)
    assert membership(Settings(), None, None, None, 2101).workers == 1


def test_dns_membership_excludes_explicit_addresses() -> None:
    with pytest.raises(ValueError, match="replaces"):
        membership(Settings(), 0, None, DOMAIN, 2101)
