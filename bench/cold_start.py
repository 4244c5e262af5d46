"""Figure 4, cold start of a Local pool: `with` to first result, and exit to destroyed, by node
count, with the breakdown (create stack, `pulumi up`, nodes = SSH + bootstrap + agent, destroy);
and the warm start: `with` to first result of a pool that adopts the nodes an equal pool left
with ``Options(keep_warm=...)``.

Run alone: .venv/bin/python bench/cold_start.py [--nodes 1 4] [--repeat 3] (skyward_iac only);
bench/run.py runs it too, beside each peer's start-to-first-result and shutdown.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import skyward_iac as sky  # noqa: E402
from skyward_iac.infra.engine import locate as engine  # noqa: E402

PHASES = ("create", "up", "nodes", "with->first result", "exit->destroyed", "warm->first result")
#: How long the pool measured before a warm start keeps its nodes for it.
KEEP_WARM = 120.0


@sky.function
def first() -> int:
    return 1


def prepare_home() -> Path:
    """A fresh SKYWARD_HOME for the bench's stacks (the engine is reused, not rebuilt)."""
    os.environ.setdefault("SKYWARD_PULUMI_ROOT", str(engine.find_engine().root))
    home = Path(tempfile.mkdtemp(prefix="skyward-bench-"))
    os.environ["SKYWARD_HOME"] = str(home)
    engine.find_engine.cache_clear()
    return home


def measure(nodes: int) -> dict[str, float]:
    """One cold start and teardown of ``nodes`` Local nodes: seconds per phase."""
    started = time.monotonic()
    compute = sky.Compute(provider=sky.Local(), nodes=nodes)
    with compute as pool:
        assert (first() >> pool) == 1
        to_first = time.monotonic() - started
        exit_started = time.monotonic()
    return {**compute.timings, "with->first result": to_first,
            "exit->destroyed": time.monotonic() - exit_started}


def measure_warm(nodes: int) -> float:
    """Seconds from `with` to the first result of a pool that adopts the ``nodes`` an equal
    pool just left warm; that pool keeps nothing warm, so nothing is left behind."""
    with sky.Compute(provider=sky.Local(), nodes=nodes,
                     options=sky.Options(keep_warm=KEEP_WARM)) as pool:
        assert (first() >> pool) == 1
    started = time.monotonic()
    compute = sky.Compute(provider=sky.Local(), nodes=nodes)
    with compute as pool:
        assert (first() >> pool) == 1
        warm = time.monotonic() - started
        assert compute.lifecycle.adopted, "the second pool did not adopt the warm nodes"
    return warm


def run(node_counts: list[int], repeat: int) -> dict[int, dict[str, float]]:
    """Median seconds per phase for each node count, after one warm-up start."""
    measure(1)  # warm-up: first engine start, uv cache, page cache
    medians = {}
    for nodes in node_counts:
        runs = [{**measure(nodes), "warm->first result": measure_warm(nodes)}
                for _ in range(repeat)]
        medians[nodes] = {phase: statistics.median(r[phase] for r in runs) for phase in runs[0]}
    return medians


def peer(start: Callable[[int], Any], call: Callable[[Any], Any], stop: Callable[[Any], None],
         workers: int, repeat: int) -> dict[str, float]:
    """A peer's median seconds from nothing to its first result, and from exit to stopped."""
    firsts, stops = [], []
    for _ in range(repeat):
        started = time.monotonic()
        handle = start(workers)
        call(handle)
        firsts.append(time.monotonic() - started)
        stopping = time.monotonic()
        stop(handle)
        stops.append(time.monotonic() - stopping)
    return {"with->first result": statistics.median(firsts),
            "exit->destroyed": statistics.median(stops)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    prepare_home()
    print(f"{'nodes':>5} {'phase':<20} {'median s':>9}")
    for nodes, phases in run(args.nodes, args.repeat).items():
        for phase, value in phases.items():
            print(f"{nodes:>5} {phase:<20} {value:>9.2f}")


if __name__ == "__main__":
    main()
