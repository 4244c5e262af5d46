"""A client process for chaos tests: brings a Local pool up and reports its progress.

Usage: python child_pool.py NODES TTL MODE, where MODE is:
  idle  - print READY <stack> once the pool is ready, then wait forever inside the block;
  task  - print READY <stack>, then run a long task inside the block;
  exit  - leave the block at once (the test interrupts the destroy);
  queued - print READY, queue 200 slow calls and cancel half of their futures, then wait
           (the test interrupts it with work queued);
  raise  - queue 200 slow calls, cancel some, then raise RuntimeError out of the block.
Progress lines go to stderr through the `skyward` logger; READY goes to stdout. With
SKYWARD_TEST_STAMP_SKEW=S its heartbeats carry a clock S seconds off (tests/chaos/skewed_beats.py).
With SKYWARD_TEST_USD_PER_HOUR=R and SKYWARD_TEST_MAX_COST=B its nodes cost R an hour each
(sky.Local(usd_per_hour=R)) and the pool has a budget of B (Options(max_cost_usd=B)).
With SKYWARD_TEST_FIRST_CONTACT=G its nodes wait G seconds for a first heartbeat
(sky.Local(first_contact_grace=G)) instead of the default 30.
"""

import logging
import os
import sys
import time

import skyward_iac as sky
from tests.chaos.skewed_beats import skew_the_beats


@sky.function
def long_task() -> None:
    time.sleep(600)


@sky.function
def slow() -> None:
    time.sleep(2)


def main() -> None:
    nodes, ttl, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if skew := os.environ.get("SKYWARD_TEST_STAMP_SKEW"):
        skew_the_beats(float(skew))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    price = float(os.environ.get("SKYWARD_TEST_USD_PER_HOUR", "0"))
    budget = os.environ.get("SKYWARD_TEST_MAX_COST")
    grace = os.environ.get("SKYWARD_TEST_FIRST_CONTACT")
    local = sky.Local(usd_per_hour=price, **({"first_contact_grace": float(grace)} if grace else {}))
    with sky.Compute(provider=local, nodes=nodes, ttl=ttl,
                     options=sky.Options(gc_on_start=False,
                                         max_cost_usd=float(budget) if budget else None)) as pool:
        print(f"READY {pool.stack_name}", flush=True)
        if mode == "idle":
            while True:
                time.sleep(1)
        if mode == "task":
            long_task() >> pool
        if mode in ("queued", "raise"):
            futures = [slow() > pool for _ in range(200)]
            for future in futures[::2]:
                future.cancel()
            print("QUEUED", flush=True)
            if mode == "raise":
                raise RuntimeError("the user's code failed with work queued")
            while True:
                time.sleep(1)


if __name__ == "__main__":
    main()
