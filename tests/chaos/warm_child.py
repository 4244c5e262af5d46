"""A client process for the warm-pool tests: opens a Local pool, reports, and leaves.

Usage: python warm_child.py NODES KEEP_WARM [ENV_VALUE [TTL]] (TTL: 20 unless given). Prints ``STACK <name>``,
``ADOPTED <bool>``, ``FIRST <seconds from Compute() to the first result>`` and ``PIDS <worker
pids, one per node>`` on stdout, then leaves the block cleanly; ``UP <seconds>`` when the stack
was destroyed at the end (its uptime as reported).
"""

import sys
import time

import skyward_iac as sky
import skyward_iac.orchestration.compute  # noqa: F401 - imports are not what is measured


@sky.function
def worker_pid() -> int:
    import os

    return os.getpid()


@sky.function
def bump() -> int:
    return sky.counter("runs").increment()


def main() -> None:
    nodes, keep_warm = int(sys.argv[1]), float(sys.argv[2])
    env = {"MARK": sys.argv[3]} if len(sys.argv) > 3 else {}
    ttl = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    started = time.monotonic()
    compute = sky.Compute(provider=sky.Local(), nodes=nodes, ttl=ttl, image=sky.Image(env=env),
                          options=sky.Options(keep_warm=keep_warm, console=False,
                                              gc_on_start=False))
    compute.on(sky.ClusterDestroyed, lambda e: print(f"UP {e.uptime:.3f}", flush=True))
    with compute as pool:
        pids = worker_pid() @ pool
        print(f"FIRST {time.monotonic() - started:.3f}", flush=True)
        print(f"STACK {pool.stack_name}", flush=True)
        print(f"ADOPTED {compute.lifecycle.adopted}", flush=True)
        print(f"PIDS {' '.join(map(str, pids))}", flush=True)
        print(f"COUNTER {bump() >> pool}", flush=True)


if __name__ == "__main__":
    main()
