"""Figure 3: one call whose argument is a 100 MB numpy array, returning its sum; MB/s
(MB = 2**20 bytes) of the whole call, argument out and result back.

Every measured call carries a fresh argument: a new array with bytes no earlier call sent, made
before the clock starts, for every system alike (the bare TCP floor included). A system that
keeps what it was sent (skyward_iac keeps large arguments by content on each node, Ray and Dask
may keep objects) therefore gets no repeat for free: this figure is the wire's, for one call.
An argument shared by many calls is bench/shared_args.py's figure.

A 1 KB call first warms up; then the median of 3 calls.
"""

from __future__ import annotations

import itertools

import numpy as np
import workloads
from common import Row, System, repeat_until, timed

MEGABYTES = 100


def fresh_array(megabytes: int, serial: int) -> np.ndarray:
    """A new ``megabytes`` float64 array whose bytes differ from every other ``serial``'s."""
    count = megabytes * 2**20 // 8
    return np.arange(serial * count, (serial + 1) * count, dtype=np.float64)


def measure(system: System, megabytes: int = MEGABYTES) -> float:
    """MB/s of a call carrying a fresh ``megabytes`` float64 array (its sum is checked)."""
    system.call(workloads.array_sum, np.arange(128, dtype=np.float64))
    serials = itertools.count()

    def once() -> float:
        array = fresh_array(megabytes, next(serials))
        expected = float(array.sum())
        result: list[float] = []
        elapsed = timed(lambda: result.append(system.call(workloads.array_sum, array)))
        if result[0] != expected:
            raise AssertionError(f"{system.name} returned a wrong sum")
        return array.nbytes / 2**20 / elapsed

    return repeat_until(once, times=3, budget=20.0)


def rows(results: dict[str, float]) -> list[Row]:
    """Figure 3's row."""
    return [Row(f"3. {MEGABYTES} MB argument", "MB/s", "higher", 300, dict(results))]
