"""Where a round trip's CPU goes: each thread's CPU per call, beside a process pool's p50.

    .venv/bin/python bench/thread_cpu.py [--calls 3000]

A real 1-node Local pool (``Worker(concurrency=1)``), 300 warm-up calls of a trivial function,
then ``--calls`` sequential ``noop(i) >> pool``: prints the p50, and the CPU per call of every
thread of the client (the caller, the wire loop, ...) and of this pool's agent and worker
processes (found by the pool's stack name in their command lines), read from
``/proc/PID/task/TID/schedstat`` before and after: unlike the wall clock, it barely moves with
others' load. A ``ProcessPoolExecutor(1)`` round trip is measured in the same run, for the
ratio goal 2 of issue 32 asks about (docs/benchmarks.md, step 14).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import workloads

import skyward_iac as sky

WARM_UP = 300


def thread_cpu(pid: int) -> dict[str, tuple[str, int]]:
    """Each thread of ``pid``: its name and the nanoseconds it has run."""
    threads = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(f"{task}/comm") as comm, open(f"{task}/schedstat") as stat:
                threads[task.rsplit("/", 1)[1]] = (comm.read().strip(), int(stat.read().split()[0]))
        except OSError:
            continue  # ended meanwhile
    return threads


def pool_processes(stack: str) -> dict[str, int]:
    """This pool's agent and worker processes, by role and pid."""
    found = {}
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for role in ("agent", "worker"):
            if stack in command and f"skyward_iac.node {role}" in command:
                pid = int(path.split("/")[2])
                found[f"{role} {pid}"] = pid
    return found


def p50_ms(call: object, calls: int) -> float:
    samples = []
    for i in range(calls):
        started = time.perf_counter()
        call(i)  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    calls = parser.parse_args().calls
    with ProcessPoolExecutor(1) as executor:
        p50_ms(lambda i: executor.submit(workloads.noop, i).result(), WARM_UP)
        pool_p50 = p50_ms(lambda i: executor.submit(workloads.noop, i).result(), calls)
    noop = sky.function(workloads.noop)
    options = sky.Options(worker=sky.Worker(concurrency=1))
    with sky.Compute(provider=sky.Local(), nodes=1, options=options) as pool:
        p50_ms(lambda i: noop(i) >> pool, WARM_UP)
        processes = {"client": os.getpid(), **pool_processes(pool.stack_name)}
        before = {role: thread_cpu(pid) for role, pid in processes.items()}
        p50 = p50_ms(lambda i: noop(i) >> pool, calls)
        after = {role: thread_cpu(pid) for role, pid in processes.items()}
    names = {str(thread.native_id): thread.name for thread in threading.enumerate()}
    print(f"p50 {p50:.3f} ms, process pool {pool_p50:.3f} ms ({p50 / pool_p50:.2f}x), "
          f"{calls} calls, load {os.getloadavg()[0]:.2f}")
    total = 0.0
    for role, threads in after.items():
        for tid, (comm, ran) in threads.items():
            per_call = (ran - before[role].get(tid, (comm, 0))[1]) / calls / 1e3
            if per_call >= 2:  # idle threads (timers, heartbeats) left out
                total += per_call
                name = names.get(tid, comm) if role == "client" else f"{comm} {tid}"
                print(f"  {role:14s} {name:30s} {per_call:7.1f} us/call")
    print(f"  all threads {total:.1f} us/call")


if __name__ == "__main__":
    main()
