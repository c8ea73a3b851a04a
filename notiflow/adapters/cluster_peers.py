"""A Bytewax cluster's members from DNS, for a flow run as a Kubernetes StatefulSet whose
replica count an autoscaler changes (``deploy/helm/notiflow``).

A Bytewax cluster has a fixed size: every process is started with the same address list
(``-a``) and its own index (``-i``), and a change of size is a restart of every process over
the same recovery partitions. Here the index is the pod's ordinal (``send-p1-3`` → 3) and
the list is every ordinal from 0 whose name resolves under the StatefulSet's headless
service (``send-p1-0.send-p1.<namespace>.svc``; the service publishes pods before they are
ready). A process starts once the count has held for ``settle`` seconds, then a watcher
re-counts every ``interval`` seconds; when the count changes and holds, the watcher stops the
process (SIGTERM: it stops at its last epoch) and Kubernetes starts it again, now with the
new list. Every member does the same, so a rescale converges on one size."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Resolves = Callable[[str], bool]
"""Whether a host name resolves now."""

_ORDINAL = re.compile(r"^(?P<set>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?P<ordinal>\d+)$")


class PeersError(ValueError):
    """The pod's name or the service's members do not describe a cluster."""


@dataclass(frozen=True)
class ClusterSpec:
    """Where a StatefulSet's pods are: ``<set>-<i>.<service_domain>:<port>``."""

    set_name: str
    ordinal: int
    service_domain: str
    port: int
    max_size: int

    def address(self, i: int) -> str:
        return f"{self.set_name}-{i}.{self.service_domain}:{self.port}"

    def addresses(self, size: int) -> list[str]:
        return [self.address(i) for i in range(size)]


def spec_from_hostname(hostname: str, service_domain: str, port: int,
                       max_size: int) -> ClusterSpec:
    """The spec of the pod named ``hostname`` (a StatefulSet pod: ``<set>-<ordinal>``)."""
    m = _ORDINAL.match(hostname.split(".", 1)[0])
    if not m:
        raise PeersError(f"{hostname!r} is not a StatefulSet pod name (<set>-<ordinal>)")
    ordinal = int(m["ordinal"])
    if ordinal >= max_size:
        raise PeersError(f"pod ordinal {ordinal} is beyond the cluster's maximum size "
                         f"{max_size} (the recovery partitions): lower the autoscaler's "
                         "maximum or create the store with more partitions")
    return ClusterSpec(m["set"], ordinal, service_domain.strip("."), port, max_size)


def count_members(spec: ClusterSpec, resolves: Resolves) -> int:
    """How many pods from ordinal 0 on resolve without a gap (at most ``max_size``)."""
    n = 0
    while n < spec.max_size and resolves(spec.address(n).rsplit(":", 1)[0]):
        n += 1
    return n


def dns_resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return False
    return True


def settle_size(spec: ClusterSpec, resolves: Resolves, *, settle: float, interval: float,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> int:
    """The member count once it includes this pod and has held for ``settle`` seconds."""
    size, since = count_members(spec, resolves), clock()
    while size <= spec.ordinal or clock() - since < settle:
        sleep(interval)
        now_size = count_members(spec, resolves)
        if now_size != size:
            log.info("cluster %s: %d members resolve (were %d); waiting for the count to hold",
                     spec.set_name, now_size, size)
            size, since = now_size, clock()
    return size


class SizeWatch:
    """Decides, one count at a time, when a running member must restart: after the count
    differed from ``size`` in ``confirm`` consecutive checks (a pod being replaced drops out of
    DNS for a moment; that is no rescale)."""

    def __init__(self, size: int, confirm: int = 2) -> None:
        self.size, self.confirm, self._strikes = size, confirm, 0

    def observe(self, count: int) -> bool:
        self._strikes = self._strikes + 1 if count != self.size else 0
        return self._strikes >= self.confirm


def watch_size(spec: ClusterSpec, size: int, resolves: Resolves, *, interval: float,
               stop: threading.Event,
               on_change: Callable[[], None] = lambda: os.kill(os.getpid(),
                                                                 signal.SIGTERM)
               ) -> threading.Thread:
    """A daemon thread that calls ``on_change`` (default: SIGTERM to this process) once the
    member count has moved away from ``size``."""
    decide = SizeWatch(size)

    def run() -> None:
        while not stop.wait(interval):
            count = count_members(spec, resolves)
            if decide.observe(count):
                log.warning("cluster %s rescaled from %d to %d members: restarting this "
                            "member with the new list", spec.set_name, size, count)
                on_change()
                return

    thread = threading.Thread(target=run, name="cluster-size-watch", daemon=True)
    thread.start()
    return thread
