"""What a pool has cost so far: its USD/hour integrated over time, from launch.

The rate changes when a resize, a spot fallback or a capacity failover changes the nodes the
stack declares; each change starts a new segment, so the total is what the nodes cost at the
rates they ran at, not the final rate times the whole uptime. Whoever acts on the total (the
budget, ``orchestration/budget.py``) listens for those changes instead of polling. The segments
(start, nodes, rate) go into the stack's ``segments`` tag (``infra/stacks/usage.py``), so any
machine can integrate the run's node-hours and USD afterwards (``skyward-iac history``, ``cost``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from skyward_iac.infra.stacks.usage import Segment


class CostMeter:
    """USD so far at a piecewise-constant rate; thread-safe."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic,
                 nodes: int = 0) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._rate = rate
        self._since = clock()
        self._spent = 0.0
        self._listeners: list[Callable[[], Any]] = []
        #: The clock's reading at the stack's creation: segments start in seconds after it.
        self._origin = self._since
        self._segments = [Segment(0.0, nodes, rate)]

    @property
    def rate(self) -> float:
        return self._rate

    def on_change(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` after every change of the rate or of the sum spent before the
        meter started (from the thread that made it)."""
        self._listeners.append(callback)

    def set_rate(self, usd_per_hour: float, nodes: int | None = None) -> bool:
        """From now on the pool costs ``usd_per_hour`` (for ``nodes`` nodes: None, as many as
        before); True if the rate changed. A change of either starts a segment."""
        with self._lock:
            now = self._clock()
            self._spent += self._rate * (now - self._since) / 3600
            self._since, changed, self._rate = now, usd_per_hour != self._rate, usd_per_hour
            last = self._segments[-1]
            count = last.nodes if nodes is None else nodes
            if (count, usd_per_hour) != (last.nodes, last.usd_per_hour):
                start = now - self._origin
                if int(start) == int(last.start_s):  # stored to the second: it replaces that one
                    start = self._segments.pop().start_s
                self._segments.append(Segment(start, count, usd_per_hour))
        if changed:
            self._changed()
        return changed

    def align(self, age_s: float) -> None:
        """The stack was created ``age_s`` seconds ago (a warm pool adopted): this meter's
        segments start from now, counted from the stack's creation; the earlier ones are the
        stack's own record (``usage.merge`` keeps them)."""
        with self._lock:
            now, last = self._clock(), self._segments[-1]
            self._origin = now - age_s
            self._segments = [Segment(age_s, last.nodes, last.usd_per_hour)]

    def segments(self) -> tuple[Segment, ...]:
        """The segments since this meter started (or was aligned), oldest first."""
        with self._lock:
            return tuple(self._segments)

    def add(self, usd: float) -> None:
        """Count ``usd`` spent before this meter started (a warm pool's life so far)."""
        with self._lock:
            self._spent += usd
        if usd:
            self._changed()

    def total(self) -> float:
        """USD spent from launch until now."""
        return self.reading()[0]

    def reading(self) -> tuple[float, float]:
        """USD spent from launch until now, and the rate now, read together."""
        with self._lock:
            return self._spent + self._rate * (self._clock() - self._since) / 3600, self._rate

    def _changed(self) -> None:
        for callback in list(self._listeners):
            callback()
