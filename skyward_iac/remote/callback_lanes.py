"""A few shared threads for what must not run on the wire loop, in order per connection.

The wire loop (remote/wire_loop.py) serves every node connection of the process from one
thread, so it must never wait on anything: user callbacks, a lost node's replacement and
fencing, output sinks, event subscribers. Each connection hands those to its ``Lane``: a
lane's calls run one after another in the order given (a task's output before its result),
on at most ``MAX_THREADS`` daemon threads shared by every lane of the process. A call that
raises is logged and the lane goes on.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Threads that run lanes' calls, whatever the number of connections.
MAX_THREADS = 4


class CallbackThreads:
    """Up to ``MAX_THREADS`` daemon threads, started as work needs them, that drain lanes."""

    def __init__(self, limit: int = MAX_THREADS) -> None:
        self._limit = limit
        self._ready: queue.SimpleQueue[Lane] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        #: Threads waiting for a lane, and lanes waiting for a thread.
        self._idle = 0
        self._queued = 0

    def schedule(self, lane: Lane) -> None:
        with self._lock:
            self._queued += 1
            start = self._queued > self._idle and self._threads < self._limit
            if start:
                self._threads += 1
        self._ready.put(lane)
        if not start:
            return
        threading.Thread(target=self._work, name=f"skyward-callbacks-{self._threads}",
                         daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            lane = self._ready.get()
            with self._lock:
                self._idle -= 1
                self._queued -= 1
            lane.drain()


class Lane:
    """The ordered calls of one connection (see the module doc)."""

    def __init__(self, threads: CallbackThreads | None = None) -> None:
        self._threads = threads
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    @property
    def idle(self) -> bool:
        """Whether nothing is queued or running: a call made now would run next."""
        return not self._scheduled

    def run(self, call: Callable[..., Any], *args: Any) -> None:
        """Run ``call(*args)`` on a callback thread after this lane's earlier calls."""
        with self._lock:
            self._calls.append((call, args))
            if self._scheduled:
                return
            self._scheduled = True
        (self._threads or callback_threads()).schedule(self)

    def drain(self) -> None:
        while True:
            with self._lock:
                if not self._calls:
                    self._scheduled = False
                    return
                call, args = self._calls.popleft()
            try:
                call(*args)
            except Exception:  # one failing callback must not stop the lane
                log.exception("callback %r failed", call)


def call_back(future: Future[Any], callbacks: list[Callable[[Future[Any]], Any]]) -> None:
    """Run the done-callbacks taken from a future resolved elsewhere, as ``Future`` would."""
    for callback in callbacks:
        try:
            callback(future)
        except Exception:
            log.exception("exception calling callback for %r", future)


def quiet_on_loop(callback: Any) -> bool:
    """Whether a done-callback is bookkeeping that wants no ``on_started`` events (its
    ``quiet_on_loop()``: orchestration/task_events.py's ``Done``)."""
    quiet = getattr(callback, "quiet_on_loop", None)
    return quiet is not None and bool(quiet())


def done_on_loop(future: Future[Any], callbacks: list[Any]) -> list[Any]:
    """Run, on the wire loop, the leading callbacks of a succeeded ``future`` that are only
    bookkeeping (their ``done_on_loop(future)`` did it and said True); the rest, from the first
    that is not, in their order, to run as any other callback."""
    for position, callback in enumerate(callbacks):
        done = getattr(callback, "done_on_loop", None)
        if done is None or not done(future):
            return callbacks[position:]
    return []


class PerProcess(Generic[T]):
    """One ``make()`` per process, made on first use. A forked child has none of its parent's
    threads, so it makes its own rather than use the parent's (whose threads it lacks)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._forget)

    def get(self) -> T:
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value

    def _forget(self) -> None:
        self._value, self._lock = None, threading.Lock()


_shared = PerProcess(CallbackThreads)


def callback_threads() -> CallbackThreads:
    """The process's callback threads."""
    return _shared.get()
