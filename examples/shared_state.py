"""Distributed collections: a cache (dict), a counter, a work queue, a lock and a barrier,
shared by every node through the etcd server the pool runs on its head node."""

import time

import skyward_iac as sky


@sky.function
def worker(count: int) -> dict:
    info = sky.instance_info()
    cache = sky.dict("cache")                      # eventual: reads from a local, watched cache
    processed = sky.counter("processed", consistency="strong")
    jobs = sky.queue("jobs")

    sky.barrier("start", info.total_nodes).wait()  # everyone starts together
    done = 0
    while (item := jobs.get(timeout=1)) is not None:
        key = item % 10
        if key not in cache:
            with sky.lock("cache-fill"):          # one node fills each entry
                if sky.dict("cache", consistency="strong").get(key) is None:
                    cache[key] = key * key
        time.sleep(0.02)                           # the "work"
        processed.increment()
        done += 1
    return {"node": info.node, "done": done}


if __name__ == "__main__":
    with sky.Compute(provider=sky.Local(), nodes=3) as pool:
        jobs = pool.queue("jobs")
        for item in range(60):
            jobs.put(item)
        started = time.monotonic()
        results = worker(60) @ pool
        for r in results:
            print(f"  node {r['node']}: {r['done']} jobs")
        print(f"processed: {pool.counter('processed').value} of 60 "
              f"in {time.monotonic() - started:.1f}s")
        print("cache:", {k: pool.dict("cache").get(k) for k in range(10)})
