"""A script that opens a ``sky.Session``, uses a Local pool and never closes the session.

Usage: python forgotten_session.py MODE, where MODE is how the script ends:
  end     - the main thread just returns (the session is a module global, as in a script);
  dropped - the session object is garbage-collected first (a ResourceWarning), then it returns;
  thread  - a non-daemon thread is still waiting on a 600 s task when the main thread returns;
  raise   - the script dies of an exception.
Prints READY <stack> once the pool answered, then DONE just before the main thread's end.
The pool keeps the default ttl (600 s): only the session's close at exit can stop it in time.
"""

import gc
import logging
import sys
import threading
import time
import warnings

import skyward_iac as sky


@sky.function
def double(x: int) -> int:
    return 2 * x


@sky.function
def long_task() -> None:
    time.sleep(600)


SESSIONS: list[sky.Session] = []


def main() -> None:
    mode = sys.argv[1]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    warnings.simplefilter("always", ResourceWarning)
    session = sky.Session()
    if mode != "dropped":
        SESSIONS.append(session)  # alive until the interpreter exits, as a script's global is
    pool = session.compute(provider=sky.Local(), nodes=1,
                           options=sky.Options(gc_on_start=False, console="log"))
    assert (double(21) >> pool) == 42
    print(f"READY {pool.stack_name}", flush=True)
    if mode == "dropped":
        del session
        gc.collect()
    if mode == "thread":
        def wait_on_the_pool() -> None:
            try:
                long_task() >> pool
            except sky.SkywardError as exc:
                print(f"THREAD {type(exc).__name__}: {exc}", flush=True)

        threading.Thread(target=wait_on_the_pool, name="user-thread").start()
        time.sleep(1)  # the task runs on the node now
    print("DONE", flush=True)
    if mode == "raise":
        raise RuntimeError("the user's script failed")


if __name__ == "__main__":
    main()
