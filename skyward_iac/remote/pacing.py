"""How many tasks to send ahead to a node whose ``Worker.buffer`` is ``"auto"``.

A node that finishes a task waits a full round trip for the next one unless the client sent
it ahead. Sending ahead has a price: a task queued behind a busy node's work could have run on
an idle node, and its timeout clock already runs. ``"auto"`` sends ahead just the work that
covers one round trip: ``floor(concurrency * overhead / run time)`` tasks, at most
``MAX_AHEAD``, where ``overhead`` is what a task costs beyond its run time (measured only on
tasks sent to an idle node, so no queueing is counted) and the run time is the longest
expected among the tasks on the node and the one being placed, per function (moving
averages). A function not measured yet on the node counts as long. So a long task is never
queued behind anything, nothing is queued behind a long task, and trivial tasks get
``MAX_AHEAD`` (the fastest setting measured, see docs/benchmarks.md).

``Pace`` holds one node's measurements; ``ahead`` is the pure policy.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

#: The most tasks sent ahead of a node's running ones.
MAX_AHEAD = 64
#: Weight of the newest sample in the moving averages.
SMOOTHING = 0.2
#: The expected run time of a function not measured yet: long.
UNKNOWN = math.inf


def _average(previous: float | None, sample: float) -> float:
    return sample if previous is None else previous + SMOOTHING * (sample - previous)


def ahead(concurrency: int, overhead: float | None, run_time: float) -> int:
    """Tasks to send beyond ``concurrency`` running ones when a round trip costs ``overhead``
    and the longest task involved is expected to run ``run_time`` seconds."""
    if overhead is None or run_time == UNKNOWN:
        return 0
    if run_time <= 0:
        return MAX_AHEAD
    return min(MAX_AHEAD, math.floor(concurrency * overhead / run_time))


@dataclass
class Pace:
    """One node's measured round-trip overhead, run time per function, and the functions of
    the tasks it holds (updated by its ``AgentClient``)."""

    overhead: float | None = None
    durations: dict[str, float] = field(default_factory=dict)
    holding: Counter[str] = field(default_factory=Counter)

    def sent(self, name: str) -> None:
        self.holding[name] += 1

    def finished(self, name: str) -> None:
        left = self.holding.pop(name, 0) - 1
        if left > 0:
            self.holding[name] = left

    def record(self, name: str, *, elapsed: float, duration: float, sent_idle: bool) -> None:
        """A result of ``name``: ``elapsed`` from send to result, ``duration`` it ran on the
        node, ``sent_idle`` whether the node held nothing else when it was sent."""
        self.durations[name] = _average(self.durations.get(name), max(0.0, duration))
        if sent_idle:
            self.overhead = _average(self.overhead, max(0.0, elapsed - duration))

    def run_time(self, name: str) -> float:
        """The expected run time of ``name`` on this node (``UNKNOWN`` if never measured)."""
        return self.durations.get(name, UNKNOWN)

    def longest_held(self) -> float:
        """The longest expected run time among the tasks the node holds (0 when idle)."""
        return max((self.run_time(name) for name in list(self.holding)), default=0.0)
