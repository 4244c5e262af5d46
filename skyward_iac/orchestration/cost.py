"""What a pool has cost so far: its USD/hour integrated over time, from launch.

The rate changes when a resize, a spot fallback or a capacity failover changes the nodes the
stack declares; each change starts a new segment, so the total is what the nodes cost at the
rates they ran at, not the final rate times the whole uptime. Whoever acts on the total (the
budget, ``orchestration/budget.py``) listens for those changes instead of polling. The segments
(start, nodes, rate) go into the stack's ``segments`` tag (``infra/stacks/usage.py``), so any
machine can integrate the run's node-hours and USD afterwards (``skyward-iac history``, ``cost``).

Spending counts from each node's launch, as a cloud bills it (AWS from the instance's running
state, GCP from RUNNING), once the meter is told launches (``track_launches``; the budget does,
from the engine's events: ``orchestration/budget.py``): a node bills at its share of the rate
from the moment the engine reports its resource created (``launched``) until it is gone
(``gone``). A node the stack declares once an update is applied whose launch was never
reported counts from the start of that update (``up_started``; the meter's start if none was
seen): the conservative reading. Without ``track_launches`` every declared node counts from
the meter's start.
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
        #: What the nodes the stack declares cost an hour, and how many it declares.
        self._rate = rate
        self._nodes = nodes
        self._since = clock()
        self._spent = 0.0
        #: The nodes billing now (launched, not gone); None: every declared node bills.
        self._billed: set[int] | None = None
        #: When the stack update under way started (None: none under way).
        self._up_since: float | None = None
        #: Since when a node whose launch was never reported counts (the last up's start).
        self._unknown_since = self._since
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
            before = self._billing_rate()
            self._accrue(now)
            changed, self._rate = usd_per_hour != self._rate, usd_per_hour
            last = self._segments[-1]
            count = last.nodes if nodes is None else nodes
            self._nodes = int(count)
            unknown = self._bill_declared(now)
            moved = changed or unknown > 0 or self._billing_rate() != before
            if (count, usd_per_hour) != (last.nodes, last.usd_per_hour):
                start = now - self._origin
                if int(start) == int(last.start_s):  # stored to the second: it replaces that one
                    start = self._segments.pop().start_s
                self._segments.append(Segment(start, count, usd_per_hour))
        if moved:
            self._changed()
        return changed

    # ---- launches (``track_launches``) -------------------------------------------------------

    def track_launches(self) -> None:
        """From now on a node bills from its reported launch (see the module doc); call it
        before the stack's first update."""
        with self._lock:
            self._accrue(self._clock())
            self._billed = set()
        self._changed()

    def up_started(self) -> None:
        """A stack update began: a node it declares whose launch is not reported counts from
        now (the first call of an update counts; ``up_ended`` or ``set_rate`` ends it)."""
        with self._lock:
            if self._up_since is None:
                self._up_since = self._clock()

    def up_ended(self) -> None:
        """The stack update under way ended (applied or failed)."""
        with self._lock:
            if self._up_since is not None:
                self._unknown_since = self._up_since
            self._up_since = None

    def launched(self, node: int) -> None:
        """Node ``node``'s instance exists from now: it bills at its share of the rate."""
        self._billing(node, add=True)

    def gone(self, node: int) -> None:
        """Node ``node``'s instance is gone: it bills no more."""
        self._billing(node, add=False)

    def _billing(self, node: int, add: bool) -> None:
        with self._lock:
            if self._billed is None or (node in self._billed) == add:
                return
            self._accrue(self._clock())
            (self._billed.add if add else self._billed.discard)(node)
        self._changed()

    def _bill_declared(self, now: float) -> int:
        """After an update (lock held): the declared nodes not reported launched bill from the
        update's start, retroactively; the count of such nodes."""
        since = self._up_since if self._up_since is not None else self._unknown_since
        self._up_since, self._unknown_since = None, now
        if self._billed is None:
            return 0
        count = self._count()
        unknown = [i for i in range(count) if i not in self._billed][
            :max(0, count - len(self._billed))]
        self._spent += self._share() * len(unknown) * (now - since) / 3600
        self._billed.update(unknown)
        return len(unknown)

    def _count(self) -> int:
        """The nodes declared (a rate without a count is one node's)."""
        return self._nodes or 1

    def _share(self) -> float:
        """One node's USD/hour (the nodes of a pool share one offer)."""
        return self._rate / self._count()

    def _billing_rate(self) -> float:
        """USD/hour of the nodes billing now (lock held)."""
        if self._billed is None:
            return self._rate
        return self._share() * len(self._billed)

    def _accrue(self, now: float) -> None:
        """Add what was spent since the last change (lock held)."""
        self._spent += self._billing_rate() * (now - self._since) / 3600
        self._since = now

    def align(self, age_s: float) -> None:
        """The stack was created ``age_s`` seconds ago (a warm pool adopted): this meter's
        segments start from now, counted from the stack's creation; the earlier ones are the
        stack's own record (``usage.merge`` keeps them)."""
        with self._lock:
            now, last = self._clock(), self._segments[-1]
            self._accrue(now)
            self._bill_declared(now)  # its nodes ran all along: from the meter's start
            self._origin = now - age_s
            self._segments = [Segment(age_s, last.nodes, last.usd_per_hour)]
        self._changed()

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
        """USD spent from launch until now, and the rate billing now, read together."""
        with self._lock:
            rate = self._billing_rate()
            return self._spent + rate * (self._clock() - self._since) / 3600, rate

    def _changed(self) -> None:
        for callback in list(self._listeners):
            callback()
