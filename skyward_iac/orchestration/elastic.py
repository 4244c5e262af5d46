"""A thread pool whose idle threads go away: many at once while nodes start, none when idle.

``concurrent.futures.ThreadPoolExecutor`` keeps every thread it ever started until shutdown, so
a pool that once started 32 nodes at a time holds 32 idle threads for its whole life (issue 32
goal 3: a client's threads must not grow with what it once did). Here a thread waits at most
``idle`` seconds for more work, then ends; the next burst starts threads again.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

#: Seconds an idle thread waits for more work before it ends.
IDLE_SECONDS = 5.0

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class ElasticThreads:
    """``submit(fn, *args) -> Future`` on at most ``max_workers`` daemon threads, each ending
    after ``idle`` seconds without work. ``shutdown(cancel_futures=True)`` cancels what has not
    started; threads under way finish their task and end."""

    def __init__(self, max_workers: int, name: str, idle: float = IDLE_SECONDS) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers, self.name, self.idle = max_workers, name, idle
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._waiting = 0  # threads blocked on the queue, ready for work
        self._queued = 0  # work items put and not yet taken
        self._shut = False
        self._serial = 0

    @property
    def threads(self) -> int:
        """Threads alive now."""
        return self._threads

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot submit after shutdown")
            self._queued += 1
            self._work.put((future, fn, args))
            if self._waiting < self._queued and self._threads < self.max_workers:
                self._threads += 1
                self._serial += 1
                threading.Thread(target=self._serve, name=f"{self.name}_{self._serial}",
                                 daemon=True).start()
        return future

    def shutdown(self, wait: bool = False, cancel_futures: bool = False) -> None:
        """No new work; with ``cancel_futures`` the queued work is cancelled. ``wait`` is
        accepted for ThreadPoolExecutor's signature; threads are daemons and are not joined."""
        with self._lock:
            self._shut = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        self._queued -= 1
                        item[0].cancel()
            for _ in range(self._threads):
                self._work.put(None)  # wakes each waiting thread to end

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            try:
                item = self._work.get(timeout=self.idle)
            except queue.Empty:
                item = None
            with self._lock:
                self._waiting -= 1
                if item is None:
                    if self._work.empty() or self._shut:
                        self._threads -= 1
                        return
                    continue  # work arrived as the wait ran out: take it
                self._queued -= 1
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the future's owner
                future.set_exception(exc)
            else:
                future.set_result(result)
