"""The task deadlines of one node connection, fired by the wire loop's timers.

Each connection keeps its own heap of ``(deadline, task_id, limit)`` and asks the loop
(remote/wire_loop.py) for one timer, at its earliest deadline. When it fires, every task past
its deadline that is still pending is taken (``take``: a result racing it is then dropped) and
handed to ``on_due`` in one list; the next timer is set. Deadlines of tasks that finished stay
in the heap until they pass (dropping them on each result would cost more) and are dropped in
bulk when they outnumber the pending tasks.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward_iac.remote.wire_loop import Timer, WireLoop

#: ``(deadline, task_id, limit)``: monotonic time, the task, its timeout in seconds.
Deadline = tuple[float, int, float]


class Deadlines:
    """Deadlines of one connection (see the module doc). Thread-safe."""

    def __init__(self, loop: WireLoop, pending: Callable[[], dict[int, Any]],
                 take: Callable[[int], Any], on_due: Callable[[list[tuple[Any, float]]], Any]
                 ) -> None:
        self._loop, self._pending, self._take, self._on_due = loop, pending, take, on_due
        self._heap: list[Deadline] = []
        self._lock = threading.Lock()
        self._timer: Timer | None = None
        self._timer_at = float("inf")
        self._closed = False

    def add(self, tasks: list[tuple[int, float]]) -> None:
        """Start the clock of ``tasks``, each ``(task_id, timeout)``."""
        now = time.monotonic()
        with self._lock:
            heap = self._heap
            # A few thousand finished tasks' deadlines cost nothing to keep: ``pending`` is
            # looked at only past that.
            if len(heap) > 4096 and len(heap) > 2 * len(pending := self._pending()) + 4096:
                heap = self._heap = [d for d in heap if d[1] in pending]
                heapq.heapify(heap)
            for task_id, timeout in tasks:
                heapq.heappush(heap, (now + timeout, task_id, timeout))
            self._arm()

    def close(self) -> None:
        """Forget every deadline; none fires after this."""
        with self._lock:
            self._closed = True
            self._heap.clear()
            if self._timer is not None:
                self._timer.cancel()

    def _arm(self) -> None:
        """A loop timer at the earliest deadline (the lock held): a timer set for later is
        replaced; one set for earlier sets the next when it fires."""
        if self._closed or not self._heap or self._heap[0][0] >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = self._heap[0][0]
        self._timer = self._loop.call_at(self._timer_at, self._expire)

    def _expire(self) -> None:
        """On the loop: take every task past its deadline and hand them over."""
        now, due = time.monotonic(), []
        with self._lock:
            self._timer, self._timer_at = None, float("inf")
            while self._heap and self._heap[0][0] <= now:
                _, task_id, limit = heapq.heappop(self._heap)
                taken = self._take(task_id)
                if taken is not None:
                    due.append((taken, limit))
            self._arm()
        if due:
            self._on_due(due)
