"""Figure 3: one call whose argument is a 100 MB numpy array, returning its sum; MB/s
(MB = 2**20 bytes) of the whole call, argument out and result back.

Every measured call carries a fresh argument: a new array with bytes no earlier call sent, made
before the clock starts, for every system alike (the bare TCP floor included). A system that
keeps what it was sent (skyward_iac keeps large arguments by content on each node, Ray and Dask
may keep objects) therefore gets no repeat for free: this figure is the wire's, for one call.
An argument shared by many calls is bench/shared_args.py's figure.

A few 1 KB calls first warm every worker up (a call may land on any of them, and a worker's
first call of a function imports numpy); then the median of 5 calls. Each call's figure is kept in
``calls`` (run.py logs them): over a Local node's Unix socket skyward_iac writes the first into
a new memfd and later ones into that same memfd, given back by the first call's task
(remote/memfd_arena.py), so the first is what a lone call gets and the median what calls after
calls get.
"""

from __future__ import annotations

import itertools

import numpy as np
import workloads
from common import Row, System, repeat_until, timed

MEGABYTES = 100
#: Each measured call's MB/s, in order, of the last ``measure``.
calls: list[float] = []


def fresh_array(megabytes: int, serial: int) -> np.ndarray:
    """A new ``megabytes`` float64 array whose bytes differ from every other ``serial``'s."""
    count = megabytes * 2**20 // 8
    return np.arange(serial * count, (serial + 1) * count, dtype=np.float64)


def measure(system: System, megabytes: int = MEGABYTES) -> float:
    """MB/s of a call carrying a fresh ``megabytes`` float64 array (its sum is checked)."""
    system.map(workloads.array_sum, [np.arange(128, dtype=np.float64)] * 8)
    serials = itertools.count()

    def once() -> float:
        array = fresh_array(megabytes, next(serials))
        expected = float(array.sum())
        result: list[float] = []
        elapsed = timed(lambda: result.append(system.call(workloads.array_sum, array)))
        if result[0] != expected:
            raise AssertionError(f"{system.name} returned a wrong sum")
        calls.append(array.nbytes / 2**20 / elapsed)
        return calls[-1]

    calls.clear()
    return repeat_until(once, times=5, budget=20.0)


def rows(results: dict[str, float]) -> list[Row]:
    """Figure 3's row."""
    return [Row(f"3. {MEGABYTES} MB argument", "MB/s", "higher", 300, dict(results))]
