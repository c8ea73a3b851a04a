"""Per-worker I/O runtime for Bytewax steps.

Bytewax runs each worker's operators on one thread. Network I/O is done per batch on one
long-lived asyncio loop per worker thread, with long-lived clients (Cassandra session,
Redis pool, provider HTTP sessions) opened on first use. Every such loop comes from
:func:`new_loop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, cast

import uvloop

T = TypeVar("T")
R = TypeVar("R")
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
CLOSE_WAIT_S = 5.0
"""How long closing a worker loop waits for one resource's ``aclose`` and then for the
cancelled tasks to end; a task that ignores its cancellation is logged and left behind."""
log = logging.getLogger(__name__)


def new_loop() -> asyncio.AbstractEventLoop:
    """The event loop of a worker or dispatcher thread: uvloop's, whose per-callback cost is
    a fraction of asyncio's (the send flow's dispatcher spent 16 % of its CPU in the asyncio
    loop itself, ``notiflow bench throughput``)."""
    return uvloop.new_event_loop()


def loop_thread(name: str) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """A new event loop running forever on a daemon thread called ``name`` (started, and
    set as that thread's current loop before this returns)."""
    ready = threading.Event()
    loop = new_loop()

    def run() -> None:
        asyncio.set_event_loop(loop)
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    ready.wait()
    return loop, thread


def stop_loop_thread(loop: asyncio.AbstractEventLoop, thread: threading.Thread | None,
                     shutdown: Coroutine[Any, Any, None], logger: logging.Logger,
                     what: str) -> None:
    """Stop a loop of :func:`loop_thread`: run ``shutdown`` on it (waiting up to 10 s; a
    failure or timeout is logged to ``logger`` as ``what``'s and does not stop the rest),
    then stop the loop and join its thread (up to 5 s)."""
    try:
        asyncio.run_coroutine_threadsafe(shutdown, loop).result(timeout=10)
    except Exception as exc:
        logger.warning("%s shutdown: %r", what, exc)
    loop.call_soon_threadsafe(loop.stop)
    if thread is not None:
        thread.join(timeout=5)


def register(closeable: Any) -> None:
    """Have :func:`close_all` call ``closeable.close()`` at shutdown."""
    _LIVE.add(closeable)


def start_all() -> None:
    """Start every registered runtime that has ``start()`` (a flow's runner calls this once
    the flow is built, so I/O opens when the flow runs and a first message finds it warm)."""
    for obj in list(_LIVE):
        start = getattr(obj, "start", None)
        if start is not None:
            start()


def close_all() -> None:
    """Close every registered runtime of this process (worker loops, dispatchers)."""
    for obj in list(_LIVE):
        with contextlib.suppress(Exception):
            obj.close()


class WorkerLoop:
    """One event loop and a set of named resources per worker thread."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[tuple[asyncio.AbstractEventLoop, dict[str, Any]]] = []
        self._lock = threading.Lock()
        register(self)

    def _state(self) -> tuple[asyncio.AbstractEventLoop, dict[str, Any]]:
        st = getattr(self._local, "state", None)
        if st is None:
            loop = new_loop()
            st = (loop, {})
            self._local.state = st
            with self._lock:
                self._all.append(st)
        return st

    def run(self, coro: Awaitable[T]) -> T:
        loop, _ = self._state()
        return loop.run_until_complete(coro)

    def resource(self, name: str, factory: Callable[[], Awaitable[R]]) -> R:
        """The worker's instance of ``name``, created by awaiting ``factory`` on first use
        (a name always stands for the same type)."""
        loop, res = self._state()
        if name not in res:
            res[name] = loop.run_until_complete(factory())
        return cast(R, res[name])

    def close(self) -> None:
        """Close every resource that has ``aclose``/``shutdown``, cancel the tasks still
        pending on the loops (a batch interrupted mid-way leaves its helpers there) and close
        the loops. Each wait is bounded by :data:`CLOSE_WAIT_S`: closing never hangs."""
        with self._lock:
            states, self._all = self._all, []
        for loop, res in states:
            for name, value in res.items():
                closer = getattr(value, "aclose", None)
                if closer is not None:
                    try:
                        loop.run_until_complete(asyncio.wait_for(closer(), CLOSE_WAIT_S))
                    except TimeoutError:
                        log.warning("closing %s took over %.0f s; left", name, CLOSE_WAIT_S)
                elif hasattr(value, "shutdown"):
                    value.shutdown()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                _, stuck = loop.run_until_complete(asyncio.wait(pending, timeout=CLOSE_WAIT_S))
                for task in stuck:
                    log.warning("task %r did not end %.0f s after its cancellation; its loop "
                                "closes anyway", task.get_name(), CLOSE_WAIT_S)
            loop.close()
