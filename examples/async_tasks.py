"""Asynchronous dispatch: `>` returns a concurrent.futures.Future at once, so the client keeps
working while nodes compute; CPU-bound work uses the process executor to use every core."""

import time
from concurrent.futures import as_completed

import skyward_iac as sky


@sky.function
def burn(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


if __name__ == "__main__":
    worker = sky.Worker(concurrency=2, executor="process")  # two processes per node
    with sky.Compute(provider=sky.Local(), nodes=2, options=sky.Options(worker=worker)) as pool:
        started = time.monotonic()
        futures = {burn(2_000_000 + i) > pool: i for i in range(4)}
        print(f"4 tasks submitted in {time.monotonic() - started:.3f}s; the client is free")
        for future in as_completed(futures):
            print(f"  task {futures[future]} done after {time.monotonic() - started:.2f}s")
        on_head = pool.run_async(burn(10), target="head").result()
        print("on the head node:", on_head)
