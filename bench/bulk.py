"""Figure 3: one call whose argument is a 100 MB numpy array, returning its sum; MB/s
(MB = 2**20 bytes) of the whole call, argument out and result back.

A 1 KB call first warms up; then the median of 3 calls.
"""

from __future__ import annotations

import numpy as np
import workloads
from common import Row, System, repeat_until, timed

MEGABYTES = 100


def measure(system: System, megabytes: int = MEGABYTES) -> float:
    """MB/s of a call carrying a ``megabytes`` float64 array (its sum is checked)."""
    array = np.arange(megabytes * 2**20 // 8, dtype=np.float64)
    expected = float(array.sum())
    system.call(workloads.array_sum, array[:128])

    def once() -> float:
        result: list[float] = []
        elapsed = timed(lambda: result.append(system.call(workloads.array_sum, array)))
        if result[0] != expected:
            raise AssertionError(f"{system.name} returned a wrong sum")
        return array.nbytes / 2**20 / elapsed

    return repeat_until(once, times=3, budget=20.0)


def rows(results: dict[str, float]) -> list[Row]:
    """Figure 3's row."""
    return [Row(f"3. {MEGABYTES} MB argument", "MB/s", "higher", 300, dict(results))]
