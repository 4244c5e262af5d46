"""Figure 1: a trivial round trip (one call, wait for its result), p50 and p99 in ms.

Three rounds of 500 sequential calls after 100 warm-up calls, on a started system
(skyward_iac: ``f(x) >> pool``); each percentile is the median of the three rounds, so one
burst of load from elsewhere on the machine does not decide the figure.
"""

from __future__ import annotations

import statistics
import time

import workloads
from common import Row, System, percentile

CALLS, WARM_UP, ROUNDS = 500, 100, 3


def measure(system: System) -> dict[str, float]:
    """``p50`` and ``p99`` of ``CALLS`` round trips, in milliseconds (median of rounds)."""
    for i in range(WARM_UP):
        system.call(workloads.noop, i)
    rounds = []
    for _ in range(ROUNDS):
        samples = []
        for i in range(CALLS):
            started = time.perf_counter()
            system.call(workloads.noop, i)
            samples.append((time.perf_counter() - started) * 1e3)
        rounds.append((percentile(samples, 50), percentile(samples, 99)))
    return {"p50": statistics.median(r[0] for r in rounds),
            "p99": statistics.median(r[1] for r in rounds)}


def rows(results: dict[str, dict[str, float]]) -> list[Row]:
    """Figure 1's rows from each system's ``measure`` result."""
    return [
        Row("1. round trip p50", "ms", "lower", 0.6,
            {name: r["p50"] for name, r in results.items()}),
        Row("1. round trip p99", "ms", "lower", None,
            {name: r["p99"] for name, r in results.items()}),
    ]
