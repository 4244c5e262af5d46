"""Figure 2: 10,000 trivial tasks submitted at once (``pool.map``), tasks per second.

Up to 3 runs, fewer when a system needs more than 20 s; the median is reported.
"""

from __future__ import annotations

import time

import workloads
from common import Row, System, repeat_until

TASKS = 10_000


def measure(system: System, tasks: int = TASKS) -> float:
    """Tasks per second of ``system.map(noop, range(tasks))`` (results checked)."""
    items = list(range(tasks))
    system.map(workloads.noop, items[:200])  # warm-up: every worker has the function

    def once() -> float:
        started = time.perf_counter()
        results = system.map(workloads.noop, items)
        elapsed = time.perf_counter() - started
        if results != items:
            raise AssertionError(f"{system.name} returned wrong results for map")
        return tasks / elapsed

    return repeat_until(once, times=3, budget=20.0)


def rows(results: dict[str, float], note: str = "") -> list[Row]:
    """Figure 2's row."""
    return [Row("2. 10k trivial tasks", "tasks/s", "higher", 10_000, dict(results), note)]
