"""The client's side of a round trip through a pool: its CPU per call, beside the p50.

    .venv/bin/python bench/client_rtt.py [--tree DIR ...] [--rounds 2] [--calls 1000]

For each tree (a checkout or ``git archive`` of a commit; this one when none is given), in
turn, ``--rounds`` times (so a burst of load from elsewhere hits every tree alike): a fresh
process starts a real 2-node Local pool with that tree's ``skyward_iac`` (console on and
``Worker(buffer="auto")``, as ``bench/run.py``'s skyward), makes 300 warm-up calls, then
``3 x --calls`` sequential ``pool.run(noop(i))``. Printed per run: the client process's CPU
per call (``time.process_time``: every thread of the client, the caller's, the wire loop's
and the callback threads'), which moves far less with others' load than the wall clock, the
median round trip and its 99th percentile, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(tree: Path, calls: int) -> dict[str, float]:
    """In this process: a pool from ``tree``'s skyward_iac, its client CPU and p50."""
    sys.path[:0] = [str(tree / "bench"), str(tree)]
    import workloads

    import skyward_iac as sky

    assert Path(sky.__file__).resolve().is_relative_to(tree.resolve()), sky.__file__
    options = sky.Options(worker=sky.Worker(concurrency=1, buffer="auto"), console=True)
    with sky.Compute(provider=sky.Local(), nodes=2, options=options) as pool:
        noop = sky.function(workloads.noop)
        for i in range(300):
            pool.run(noop(i))
        cpu, walls = [], []
        for _ in range(3):
            started = time.process_time()
            for i in range(calls):
                began = time.perf_counter()
                pool.run(noop(i))
                walls.append(time.perf_counter() - began)
            cpu.append((time.process_time() - started) / calls)
    walls.sort()
    return {"cpu_us": statistics.median(cpu) * 1e6, "p50_ms": statistics.median(walls) * 1e3,
            "p99_ms": walls[int(len(walls) * 0.99)] * 1e3, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", help="a tree to measure")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child's own run
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.calls)))
        return
    trees = args.tree or [ROOT]
    for _ in range(args.rounds):
        for tree in trees:
            out = subprocess.run([sys.executable, __file__, "--one", str(tree), "--calls",
                                  str(args.calls)], capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{tree}: client CPU {result['cpu_us']:.0f} µs/call, p50 "
                  f"{result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, "
                  f"load {result['load']:.1f}", flush=True)


if __name__ == "__main__":
    main()
