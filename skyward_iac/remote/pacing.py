"""How many tasks to send ahead to a node whose ``Worker.buffer`` is ``"auto"`` (pure).

A node that finishes a task waits a full round trip for the next one unless the client sent
it ahead. Sending ahead has a price: a task queued behind a busy node's work could have run on
an idle node, and its timeout clock already runs. ``"auto"`` sends ahead just the work that
covers one round trip: ``floor(concurrency * overhead / duration)`` tasks, at most
``MAX_AHEAD``, where ``overhead`` is what a task costs beyond its run time (measured only on
tasks sent to an idle node, so no queueing is counted) and ``duration`` is how long tasks run
on the node (moving averages of both). Tasks that run longer than a round trip get nothing
ahead (exactly ``buffer=0``); trivial tasks get ``MAX_AHEAD`` (the fastest setting measured,
see docs/benchmarks.md). Until a node has returned a result sent to it idle, nothing is ahead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The most tasks sent ahead of a node's running ones.
MAX_AHEAD = 64
#: Weight of the newest sample in the moving averages.
SMOOTHING = 0.2


def _average(previous: float | None, sample: float) -> float:
    return sample if previous is None else previous + SMOOTHING * (sample - previous)


@dataclass
class Pace:
    """One node's measured round-trip overhead and task run time (seconds)."""

    overhead: float | None = None
    duration: float | None = None

    def record(self, *, elapsed: float, duration: float, sent_idle: bool) -> None:
        """A task's result: ``elapsed`` from send to result, ``duration`` it ran on the node,
        ``sent_idle`` whether the node had nothing else pending when it was sent."""
        self.duration = _average(self.duration, max(0.0, duration))
        if sent_idle:
            self.overhead = _average(self.overhead, max(0.0, elapsed - duration))

    def ahead(self, concurrency: int) -> int:
        """Tasks to send beyond the node's ``concurrency`` running ones."""
        if self.overhead is None or self.duration is None:
            return 0
        if self.duration <= 0:
            return MAX_AHEAD
        return min(MAX_AHEAD, math.floor(concurrency * self.overhead / self.duration))
