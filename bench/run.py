"""The benchmark suite: skyward_iac on Local nodes beside Ray, Dask, a process pool and a bare
loopback TCP worker, all measured in this run; prints a markdown table of medians and ratios.

Run: scripts/bench (sets up, installs the pinned bench extra, then runs this), or
.venv/bin/python bench/run.py [--systems ...] [--figures 1 2 3 4 5 6 7] [--fleet-nodes ...]
[--json FILE].
Every system runs alone (started, measured, stopped) so none competes for the 2 cores with
another's idle processes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]
# The peers' workers import the workloads by reference: they must find this folder too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(BENCH), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

import bulk  # noqa: E402
import cold_start  # noqa: E402
import collection_ops  # noqa: E402
import fleet
import fleet_report
import latency  # noqa: E402
import scale  # noqa: E402
import throughput  # noqa: E402
import workloads  # noqa: E402
from common import PEERS, SKYWARD, Row, table  # noqa: E402
from systems import Dask, ProcessPool, Ray, Skyward, SkywardTls  # noqa: E402
from tcp_floor import TcpFloor  # noqa: E402

SYSTEMS: dict[str, Any] = {
    "tcp-floor": TcpFloor, "processpool": ProcessPool, SKYWARD: Skyward,
    "skyward-tls": SkywardTls, "ray": Ray, "dask": Dask,
}


def machine() -> str:
    """nproc, CPU model, memory, OS and Python: where the numbers come from."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                  .splitlines() if line.startswith("model name")), platform.processor())
    mem_kb = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal")))
    return (f"{os.cpu_count()} CPUs ({model}), {mem_kb / 2**20:.1f} GiB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}")


def say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def dispatch_figures(names: list[str], figures: set[int]) -> tuple[list[Row], dict[str, Any]]:
    """Figures 1, 2, 3 and 5: every system started once, measured, and stopped."""
    lat: dict[str, dict[str, float]] = {}
    tput: dict[str, float] = {}
    tput_fixed: dict[int, float] = {}
    bulk_rates: dict[str, float] = {}
    shared: dict[str, dict[str, float | None]] = {}
    for name in names:
        say(f"{name}: starting")
        try:
            system = _started(SYSTEMS[name], 2)
        except Exception:
            say(f"{name} did not start; its cells stay empty:\n{traceback.format_exc()}")
            continue
        try:
            if 1 in figures:
                lat[name] = latency.measure(system)
                say(f"{name}: round trip {lat[name]}")
            if 2 in figures:
                tput[name] = throughput.measure(system)
                say(f"{name}: {tput[name]:.0f} tasks/s")
            if 3 in figures:
                bulk_rates[name] = bulk.measure(system)
                each = ", ".join(f"{rate:.0f}" for rate in bulk.calls)
                say(f"{name}: {bulk_rates[name]:.0f} MB/s (the calls: {each})")
            if 5 in figures and hasattr(system, "collections"):
                shared[name] = collection_ops.measure(system)
                say(f"{name}: collections {shared[name]}")
        except Exception:
            say(f"{name} failed:\n{traceback.format_exc()}")
        finally:
            system.stop()
            say(f"{name}: stopped")
        if name == SKYWARD and 2 in figures:
            tput_fixed.update(fixed_buffers())
    rows: list[Row] = []
    if lat:
        rows += latency.rows(lat)
    if tput:
        rows += throughput.rows(tput, "skyward: the default Worker(), buffer='auto'")
    for buffer, rate in tput_fixed.items():
        rows += [Row("2. 10k trivial tasks", "tasks/s", "higher", None, {SKYWARD: rate},
                     f"skyward: Worker(buffer={buffer}), a pool of its own")]
    if bulk_rates:
        rows += bulk.rows(bulk_rates)
    if shared:
        rows += collection_ops.rows(shared)
    raw = {"latency": lat, "throughput": tput, "throughput_fixed_buffer": tput_fixed,
           "bulk": bulk_rates, "collections": shared}
    return rows, raw


def fixed_buffers(buffers: tuple[int, ...] = (64, 0)) -> dict[int, float]:
    """Figure 2 for skyward with a fixed ``Worker(buffer=N)``, each in a pool of its own,
    beside the default "auto" measured just before."""
    rates: dict[int, float] = {}
    for buffer in buffers:
        try:
            system = _started(functools.partial(Skyward, buffer=buffer), 2)
        except Exception:
            say(f"skyward buffer={buffer} did not start:\n{traceback.format_exc()}")
            continue
        try:
            rates[buffer] = throughput.measure(system)
            say(f"skyward: {rates[buffer]:.0f} tasks/s with buffer={buffer}")
        except Exception:
            say(f"skyward buffer={buffer} failed:\n{traceback.format_exc()}")
        finally:
            system.stop()
    return rates


def cold_figures(names: list[str], node_counts: list[int], repeat: int
                 ) -> tuple[list[Row], dict[int, dict[str, float]]]:
    """Figure 4: skyward_iac's cold start and teardown beside each peer's start and stop."""
    rows: list[Row] = []
    ours = cold_start.run(node_counts, repeat) if SKYWARD in names else {}
    for nodes in node_counts:
        first: dict[str, float | None] = {}
        down: dict[str, float | None] = {}
        if nodes in ours:
            first[SKYWARD] = ours[nodes]["with->first result"]
            down[SKYWARD] = ours[nodes]["exit->destroyed"]
        for name in names:
            if name in (SKYWARD, "skyward-tls"):  # the same start: only the agent path differs
                continue
            say(f"{name}: cold start with {nodes} worker(s)")
            try:
                figures = cold_start.peer(functools.partial(_started, SYSTEMS[name]),
                                          _first_call, _stop, nodes, repeat)
            except Exception:
                say(f"{name} cold start failed:\n{traceback.format_exc()}")
                continue
            first[name], down[name] = figures["with->first result"], figures["exit->destroyed"]
        rows.append(Row(f"4. cold start {nodes} node(s): start → first result", "s", "lower",
                        None, first))
        rows.append(Row(f"4. {nodes} node(s): exit → destroyed / stopped", "s", "lower", None,
                        down))
        if nodes in ours:  # peers have nothing like it: "—"
            rows.append(Row(f"4. warm start {nodes} node(s): start → first result "
                            "(adopts nodes an equal pool left with Options(keep_warm))", "s",
                            "lower", 0.5, {SKYWARD: ours[nodes]["warm->first result"]}))
    return rows, ours


def _started(kind: Any, workers: int, attempts: int = 2) -> Any:
    """A started system; a start that fails (Ray's 30 s raylet wait on a busy machine) is
    cleaned up and tried once more."""
    for attempt in range(attempts):
        system = kind()
        try:
            system.start(workers)
            return system
        except Exception:
            try:
                system.stop()
            except Exception:
                pass
            if attempt == attempts - 1:
                raise
            say(f"{system.name}: start failed, trying again")
    raise AssertionError("unreachable")


def _first_call(system: Any) -> Any:
    return system.call(workloads.noop, 1)


def _stop(system: Any) -> None:
    system.stop()


def breakdown(ours: dict[int, dict[str, float]]) -> str:
    """skyward_iac's cold start by phase (medians, seconds)."""
    lines = ["| nodes | " + " | ".join(cold_start.PHASES) + " |",
             "| ---: |" + " ---: |" * len(cold_start.PHASES)]
    for nodes, phases in ours.items():
        lines.append(f"| {nodes} | " + " | ".join(f"{phases.get(p, 0):.2f} s"
                                                  for p in cold_start.PHASES) + " |")
    lines += ["", "warm start against cold start, same run: " + ", ".join(
        f"{nodes} node(s) {p['with->first result'] / p['warm->first result']:.1f}× faster"
        for nodes, p in ours.items() if p.get("warm->first result"))]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    parser.add_argument("--figures", nargs="+", type=int, choices=[1, 2, 3, 4, 5, 6, 7],
                        default=[1, 2, 3, 4, 5, 6, 7])
    parser.add_argument("--cold-nodes", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--cold-repeat", type=int, default=3)
    parser.add_argument("--scale-nodes", nargs="+", type=int, default=list(scale.LOCAL_NODES),
                        help="figure 6: Local pool sizes")
    parser.add_argument("--scale-aws", nargs="+", type=int, default=list(scale.AWS_NODES),
                        help="figure 6: AWS program sizes under mocks")
    parser.add_argument("--fleet-nodes", nargs="+", type=int, default=list(fleet.SIZES),
                        help="figure 7: simulated fleet sizes")
    parser.add_argument("--fleet-tasks", type=int, default=fleet.MAP_TASKS,
                        help="figure 7: the map's size")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--console", default=True, choices=["log", "minimal", "silent"],
                        help="skyward's Options.console (default: True, the log console here)")
    args = parser.parse_args()
    Skyward.console = args.console
    figures = set(args.figures)
    # Dask warns that a 100 MB argument makes a large graph: that is the figure being measured.
    warnings.filterwarnings("ignore", message="Sending large graph")
    home = cold_start.prepare_home()
    started = time.monotonic()
    try:
        rows, raw = dispatch_figures(args.systems, figures)
        ours: dict[int, dict[str, float]] = {}
        if 4 in figures:
            cold_rows, ours = cold_figures(args.systems, args.cold_nodes, args.cold_repeat)
            rows += cold_rows
            raw["cold_start"] = {str(k): v for k, v in ours.items()}
        if 6 in figures and SKYWARD in args.systems:  # skyward_iac alone, no peer
            say("scale: Local pools and the AWS program, each size in a fresh process")
            raw["scale"] = scale.measure(args.scale_nodes, args.scale_aws)
        if 7 in figures and SKYWARD in args.systems:  # skyward_iac's client alone
            say("fleet: the real client against simulated nodes, each size in a fresh process")
            raw["fleet"] = fleet.measure(args.fleet_nodes, args.fleet_tasks)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    rows.sort(key=lambda row: row.figure.split(".")[0])  # figure order; stable within one
    peers = [p for p in PEERS if p in args.systems]
    print(f"\nMachine: {machine()}")
    print(f"Suite time: {time.monotonic() - started:.0f} s. Each peer cell: its value "
          "(skyward's advantage: >1× means skyward_iac is better).\n")
    print(table(rows, peers))
    if ours:
        print("\nskyward_iac cold start by phase (medians):\n")
        print(breakdown(ours))
    if "scale" in raw:
        print("\n6. Scale (no peer: each figure beside linear growth):\n")
        print(scale.report(raw["scale"]))
    if raw.get("fleet"):
        print(f"\n7. A thousand nodes, simulated (the real client; each node an SSH server and "
              f"an agent speaking the real protocol in one simulator process: no stack, no "
              f"bootstrap, no sshd, no worker processes; load average "
              f"{os.getloadavg()[0]:.1f}):\n")
        print(fleet_report.report(raw["fleet"]))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), **raw}, indent=2))


if __name__ == "__main__":
    main()
