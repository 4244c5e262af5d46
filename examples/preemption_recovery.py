"""Preemption recovery: a node is reclaimed in the middle of a map; every result is still right.

A Local node's sandbox is stopped from outside while a ``map`` runs on two nodes, as a spot
interruption would take an instance. The pool notices the lost connection, emits
``InstancePreempted``, retries the node's unfinished calls on the other node, and brings the
node back through a stack update (``InstanceReplaced``). On AWS or GCP the node's agent also
watches the cloud's interruption notice, so the replacement starts before the node dies.
"""

import threading

import skyward_iac as sky
from skyward_iac.infra.stacks.home import local_nodes_dir
from skyward_iac.processes import stop_sandbox


@sky.function
def slow_square(x: int) -> int:
    import time

    time.sleep(0.15)
    return x * x


if __name__ == "__main__":
    seen: list[sky.Event] = []
    replaced = threading.Event()
    with sky.Compute(provider=sky.Local(), nodes=2,
                     options=sky.Options(worker=sky.Worker(concurrency=2))) as pool:
        pool.on(sky.InstancePreempted, seen.append)
        pool.on(sky.InstanceReplaced, lambda event: (seen.append(event), replaced.set()))
        victim = local_nodes_dir() / pool.stack_name / "node-1"
        threading.Timer(1.0, stop_sandbox, args=(victim,)).start()  # reclaim node 1 mid-map
        results = pool.map(slow_square, range(40))
        print("all results correct:", results == [x * x for x in range(40)])
        replaced.wait(120)
        for event in seen:
            print(f"{type(event).__name__}: node {event.node}",
                  getattr(event, "reason", "") or f"-> {getattr(event, 'instance_id', '')}")
        print("node 1 serves again:",
              pool.run(slow_square(7), target=1) if replaced.is_set() else None)
