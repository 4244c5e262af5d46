"""Issue 32 goal 1, second half: 64 tasks sharing one 100 MB argument, on a real 1-node Local
pool, with large arguments shared (sent once per node connection, remote/shared_buffers.py) and
not shared (``SKYWARD_SHARED_ARGS=0``: every task carries its bytes, as before), in one run,
alternating, beside the plain one-call 100 MB figure. Each round uses a new array, so a shared
run never finds its argument already on the node.

    .venv/bin/python bench/shared_args.py [--tasks 64] [--megabytes 100] [--rounds 1]
        [--how gather|map] [--json FILE]

``gather`` (``sky.gather(*calls) >> pool``: no snapshot, the caller waits) is the default;
``map`` (``pool.map``: each call snapshots its arguments) is measured with sharing on only,
since without sharing it would hold one 100 MB copy per task on the client.
Prints seconds per figure, the ratio, and the load averages (1, 5, 15 min) before each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]
# The nodes import the workloads by reference: they must find this folder too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(BENCH), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

import numpy as np
import workloads
from systems import Skyward

from skyward_iac.remote import shared_buffers


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _array(megabytes: int, seed: int) -> np.ndarray[Any, Any]:
    """A new array per round: a shared run must send its bytes once, not find them kept."""
    return np.arange(megabytes * 2**20 // 8, dtype=np.float64) + seed


def _sharing(on: bool) -> None:
    os.environ[shared_buffers.ENABLED_ENV] = "1" if on else "0"


def _many(system: Skyward, how: str, array: np.ndarray[Any, Any], tasks: int) -> float:
    """Seconds for ``tasks`` calls of ``array_sum(array)``, all results checked."""
    import skyward_iac as sky

    remote = system._remote(workloads.array_sum)
    expected = float(array.sum())
    started = time.perf_counter()
    if how == "map":
        results = system.pool.map(remote, [array] * tasks)
    else:
        results = list(sky.gather(*[remote(array) for _ in range(tasks)]) >> system.pool)
    elapsed = time.perf_counter() - started
    if results != [expected] * tasks:
        raise AssertionError("a task returned a wrong sum")
    return elapsed


def _one(system: Skyward, array: np.ndarray[Any, Any]) -> float:
    started = time.perf_counter()
    if system.call(workloads.array_sum, array) != float(array.sum()):
        raise AssertionError("the single call returned a wrong sum")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--how", choices=("gather", "map"), default="gather")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    system = Skyward()
    system.start(workers=1)
    figures: dict[str, list[float]] = {"single off": [], "single on": [], "many on": [],
                                       "many off": []}
    loads: list[str] = []
    try:
        system.call(workloads.array_sum, np.arange(128, dtype=np.float64))  # warm up
        seed = 0
        for _ in range(args.rounds):
            for name, on in (("single off", False), ("single on", True)):
                seed += 1
                _sharing(on)
                loads.append(f"{name}: {_load()}")
                figures[name].append(_one(system, _array(args.megabytes, seed)))
            for name, on in (("many on", True), ("many off", False)):
                if args.how == "map" and not on:
                    continue
                seed += 1
                _sharing(on)
                loads.append(f"{name}: {_load()}")
                figures[name].append(_many(system, args.how, _array(args.megabytes, seed),
                                           args.tasks))
                print(f"{name}: {figures[name][-1]:.2f} s", flush=True)
    finally:
        _sharing(True)
        system.stop()

    medians = {name: statistics.median(values) for name, values in figures.items() if values}
    size = f"{args.megabytes} MB"
    print(f"\n{args.tasks} tasks x one {size} array ({args.how}), 1 Local node; "
          f"load averages (1/5/15 min) before each: {'; '.join(loads)}")
    for name, seconds in medians.items():
        count = 1 if name.startswith("single") else args.tasks
        rate = args.megabytes * count / seconds
        print(f"- {name:<10} {seconds:8.2f} s  ({rate:,.0f} MB/s of arguments)")
    if "many off" in medians:
        print(f"- sharing on vs off: {medians['many off'] / medians['many on']:.1f}x faster")
    print(f"- {args.tasks} shared tasks vs {args.tasks} x the single call (sharing off): "
          f"{medians['single off'] * args.tasks / medians['many on']:.1f}x")
    if args.json is not None:
        args.json.write_text(json.dumps({"figures": figures, "medians": medians, "loads": loads,
                                         "tasks": args.tasks, "megabytes": args.megabytes,
                                         "how": args.how}, indent=2))


if __name__ == "__main__":
    main()
