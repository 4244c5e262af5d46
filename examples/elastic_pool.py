"""Elastic pool: a burst of work grows the pool, idleness shrinks it back.

``sky.Nodes(desired=1, max=3)`` starts one Local node. While calls wait for a slot the
autoscaler grows the pool (a stack update adds nodes, which bootstrap and join); once the pool
has been idle for ``autoscale_idle_timeout`` seconds it shrinks back to its floor (the extra
nodes drain, then a stack update deletes them). The timeouts here are short for the demo.
"""

import threading
import time

import skyward_iac as sky


@sky.function
def crunch(seconds: float) -> int:
    import time

    time.sleep(seconds)
    return sky.instance_info().node


if __name__ == "__main__":
    options = sky.Options(autoscale_cooldown=0.5, autoscale_idle_timeout=2,
                          reconcile_tick_interval=0.3)
    with sky.Compute(provider=sky.Local(), nodes=sky.Nodes(desired=1, max=3),
                     options=options) as pool:
        sizes = [pool.current_nodes()]
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                if pool.current_nodes() != sizes[-1]:
                    sizes.append(pool.current_nodes())
                    print("nodes in service:", sizes[-1])
                time.sleep(0.1)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        print("burst of 12 calls on", pool.current_nodes(), "node")
        served_by = pool.map(crunch, [1.5] * 12)
        print("calls per node:", {n: served_by.count(n) for n in sorted(set(served_by))})
        deadline = time.monotonic() + 60
        while pool.current_nodes() > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        watching.set()
        watcher.join()
        print("sizes seen:", sizes)
        print(f"grew to {max(sizes)} and shrank back to {pool.current_nodes()}")
