"""Cold start of a Local pool: `with` to first result, and exit to destroyed, by node count.

Run: .venv/bin/python bench/cold_start.py [--nodes 1 4] [--repeat 3]
Prints medians per phase (create, up, nodes = SSH + bootstrap + agent, destroy). The peer figure
is a bare `pulumi up`/`destroy` of the same stack without bootstrap, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import skyward_iac as sky  # noqa: E402
from skyward_iac.infra import engine  # noqa: E402


@sky.function
def first() -> int:
    return 1


def measure(nodes: int) -> dict[str, float]:
    started = time.monotonic()
    compute = sky.Compute(provider=sky.Local(), nodes=nodes)
    with compute as pool:
        assert (first() >> pool) == 1
        to_first = time.monotonic() - started
        exit_started = time.monotonic()
    return {**compute.timings, "with->first result": to_first,
            "exit->destroyed": time.monotonic() - exit_started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("SKYWARD_PULUMI_ROOT", str(engine.find_engine().root))
    os.environ["SKYWARD_HOME"] = tempfile.mkdtemp(prefix="skyward-bench-")
    engine.find_engine.cache_clear()
    measure(1)  # warm-up: first engine start, uv cache, page cache
    print(f"{'nodes':>5} {'phase':<20} {'median s':>9} {'min s':>7} {'max s':>7}")
    for nodes in args.nodes:
        runs = [measure(nodes) for _ in range(args.repeat)]
        for phase in runs[0]:
            values = [r[phase] for r in runs]
            print(f"{nodes:>5} {phase:<20} {statistics.median(values):>9.2f} "
                  f"{min(values):>7.2f} {max(values):>7.2f}")


if __name__ == "__main__":
    main()
