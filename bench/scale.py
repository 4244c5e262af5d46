"""The scale figure: how a Local pool's costs grow with its node count (1, 8, 16, 32), and how
long the AWS program takes to declare 32 to 256 nodes under Pulumi's mocks (no cloud here).

Per node count, one pool in a fresh process (so memory and threads start from the same
baseline): `with` to first result, broadcast latency (``fn() @ pool``, median of
5), a ``map`` of 10,000 trivial tasks, the client's memory (RSS) and threads per node once the
pool is ready, and exit to destroyed. The AWS program also runs in a fresh process per size,
so its peak RSS is its own.

Run: .venv/bin/python bench/scale.py [--nodes 1 8 16 32] [--aws 32 64 128 256] [--json FILE]
(about 4 minutes on 2 cores). bench/run.py runs it as figure 6.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import cold_start  # noqa: E402

import skyward_iac as sky  # noqa: E402

LOCAL_NODES = (1, 8, 16, 32)
AWS_NODES = (32, 64, 128, 256)
MAP_TASKS = 10_000


@sky.function
def noop(x: int = 0) -> int:
    return x


def peak_mib() -> float:
    """This process's peak resident memory (MiB) since its exec (``VmHWM``; ``ru_maxrss`` would
    carry the peak of the parent it was forked from)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def process_status() -> tuple[float, int]:
    """This process's resident memory (MiB) and OS threads (gRPC's and paramiko's included)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def local(nodes: int) -> dict[str, float]:
    """One pool of ``nodes`` Local nodes, measured from `with` to destroyed (in this process,
    which must be fresh)."""
    import skyward_iac.orchestration.compute  # noqa: F401 - imports are not the pool's cost
    from skyward_iac.infra.engine import locate as engine

    engine.find_engine()
    rss_before, threads_before = process_status()
    started = time.monotonic()
    compute = sky.Compute(provider=sky.Local(), nodes=nodes,
                          options=sky.Options(console="silent"))
    with compute as pool:
        assert noop(1) >> pool == 1
        to_first = time.monotonic() - started
        rss, threads = process_status()
        broadcasts = []
        for _ in range(5):
            sent = time.monotonic()
            assert noop(2) @ pool == [2] * nodes
            broadcasts.append(time.monotonic() - sent)
        sent = time.monotonic()
        assert sum(pool.map(noop, range(MAP_TASKS))) == sum(range(MAP_TASKS))
        map_rate = MAP_TASKS / (time.monotonic() - sent)
        exiting = time.monotonic()
    return {"with->first result s": to_first,
            "broadcast ms": statistics.median(broadcasts) * 1000,
            "map 10k tasks/s": map_rate,
            "client MiB per node": (rss - rss_before) / nodes,
            "client threads per node": (threads - threads_before) / nodes,
            "exit->destroyed s": time.monotonic() - exiting}


def aws_program(nodes: int) -> dict[str, float]:
    """Declare ``nodes`` AWS instances under the mocks, in this (fresh) process."""
    from skyward_iac.infra.programs import ClusterRequest
    from skyward_iac.infra.programs.aws import aws_program as program_for
    from skyward_iac.infra.programs.testing import AWS_INVOKES, ProgramMocks, run_program

    spec = sky.Spec(provider=sky.AWS(ssh_cidr="198.51.100.7/32", use_default_vpc=True),
                    accelerator=sky.accelerators.A10G())
    started = time.monotonic()
    mocks = ProgramMocks(AWS_INVOKES)
    exports = run_program(program_for(ClusterRequest("aws-scale", spec, nodes)), mocks)
    seconds = time.monotonic() - started
    assert len(exports["nodes"]) == nodes
    return {"seconds": seconds, "resources": float(len(mocks.resources)),
            "peak MiB": peak_mib()}


def in_fresh_processes(kind: str, sizes: list[int]) -> dict[int, dict[str, float]]:
    """``local`` or ``aws_program`` per size, each in a process of its own."""
    results = {}
    for nodes in sizes:
        print(f"[scale] {kind}: {nodes} node(s)...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--one", kind, str(nodes)],
                              stdout=subprocess.PIPE, text=True, check=True)
        results[nodes] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def cell(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def table(rows: dict[int, dict[str, float]], first: str) -> str:
    """A markdown table: one row per size, a column per figure."""
    columns = list(next(iter(rows.values())))
    lines = [f"| {first} | " + " | ".join(columns) + " |", "| ---: |" + " ---: |" * len(columns)]
    for size, figures in rows.items():
        lines.append(f"| {size} | " + " | ".join(cell(figures[c]) for c in columns) + " |")
    return "\n".join(lines)


def growth(rows: dict[int, dict[str, float]]) -> str:
    """How each figure grew between the two largest sizes, beside linear growth."""
    if len(rows) < 2:
        return ""
    small, large = sorted(rows)[-2:]
    ratios = ", ".join(f"{column} ×{rows[large][column] / rows[small][column]:.2f}"
                       for column in rows[large] if rows[small][column])
    return (f"{small} → {large} nodes: {ratios} (linear growth: ×{large / small:.2f} for "
            "totals, ×1 for rates and per-node figures)")


def measure(nodes: list[int], aws: list[int]) -> dict[str, dict[int, dict[str, float]]]:
    """The scale figure: Local pools of ``nodes`` and the AWS program of ``aws`` nodes, each
    in a fresh process, after one warm-up pool (in the ``SKYWARD_HOME`` already prepared)."""
    cold_start.measure(1)  # warm-up: first engine start, uv cache, page cache
    return {"local": in_fresh_processes("local", nodes), "aws": in_fresh_processes("aws", aws)}


def report(figures: dict[str, dict[int, dict[str, float]]]) -> str:
    """The scale figure's tables, each with its growth between the two largest sizes."""
    parts = []
    for kind, title in (("local", "Local pools"), ("aws", "AWS program under mocks")):
        if figures[kind]:
            parts.append(f"{title}:\n\n{table(figures[kind], 'nodes')}\n\n{growth(figures[kind])}\n")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="*", default=list(LOCAL_NODES))
    parser.add_argument("--aws", type=int, nargs="*", default=list(AWS_NODES))
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # KIND NODES, in this process
    args = parser.parse_args()
    if args.one:
        kind, nodes = args.one
        print(json.dumps((local if kind == "local" else aws_program)(int(nodes))))
        return
    cold_start.prepare_home()  # the children inherit SKYWARD_HOME
    figures = measure(args.nodes, args.aws)
    print(report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
