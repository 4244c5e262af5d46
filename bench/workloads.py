"""The functions every system runs. Plain module-level functions, so each system ships them its
own way: skyward_iac pickles this module by value, the peers import it (PYTHONPATH)."""

from __future__ import annotations

import time
from typing import Any


def noop(x: Any) -> Any:
    """The trivial task: return the argument."""
    return x


def array_sum(array: Any) -> float:
    """The bulk task: the sum of a numpy array (the argument dominates, the work is ~10 ms)."""
    return float(array.sum())


def _loop(op: Any, seconds: float) -> float:
    """Run ``op`` for ``seconds`` (after 20 warm-up calls); operations per second."""
    for _ in range(20):
        op()
    count, started = 0, time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        op()
        count += 1
    return count / (time.perf_counter() - started)


# ---- skyward_iac collections, called inside tasks on the nodes --------------------------------


def sky_counter(name: str, seconds: float) -> float:
    """Strong counter increments per second from this node."""
    import skyward_iac as sky

    counter = sky.counter(name, consistency="strong")
    return _loop(counter.increment, seconds)


def sky_dict_get(name: str, consistency: str, seconds: float) -> float:
    """Dict gets per second of one present key from this node."""
    import skyward_iac as sky

    shared = sky.dict(name, consistency=consistency)  # type: ignore[arg-type]
    shared["key"] = "value"
    return _loop(lambda: shared["key"], seconds)


def sky_lock(name: str, seconds: float) -> float:
    """Lock acquire+release pairs per second from this node."""
    import skyward_iac as sky

    lock = sky.lock(name)

    def pair() -> None:
        lock.acquire()
        lock.release()

    return _loop(pair, seconds)


def sky_queue(name: str, seconds: float) -> float:
    """Queue put+get pairs per second from this node."""
    import skyward_iac as sky

    queue = sky.queue(name)

    def pair() -> None:
        queue.put(1)
        queue.get(timeout=5)

    return _loop(pair, seconds)


# ---- peers' equivalents, called inside their workers ------------------------------------------


def ray_actor_op(actor: Any, method: str, seconds: float) -> float:
    """Calls per second of a Ray actor method (the counter / dict / queue of a Ray program)."""
    import ray

    bound = getattr(actor, method)
    return _loop(lambda: ray.get(bound.remote()), seconds)


def ray_queue(queue: Any, seconds: float) -> float:
    """``ray.util.queue.Queue`` put+get pairs per second."""

    def pair() -> None:
        queue.put(1)
        queue.get(timeout=5)

    return _loop(pair, seconds)


class RayState:
    """A Ray actor holding a counter and a dict: Ray's way to share state between tasks."""

    def __init__(self) -> None:
        self.count = 0
        self.data = {"key": "value"}

    def increment(self) -> int:
        self.count += 1
        return self.count

    def get(self) -> str:
        return self.data["key"]


def dask_op(kind: str, name: str, seconds: float) -> float:
    """Operations per second of a Dask distributed primitive, from inside a Dask task."""
    from distributed import Lock, Queue, Variable

    if kind == "dict-get":
        variable = Variable(name)
        variable.set("value")
        return _loop(variable.get, seconds)
    if kind == "lock":
        lock = Lock(name)

        def pair() -> None:
            lock.acquire()
            lock.release()

        return _loop(pair, seconds)
    queue = Queue(name)

    def put_get() -> None:
        queue.put(1)
        queue.get(timeout=5)

    return _loop(put_get, seconds)


def manager_op(kind: str, proxies: dict[str, Any], seconds: float) -> float:
    """Operations per second on ``multiprocessing.Manager`` proxies (the process pool's way)."""
    if kind == "counter":
        value, lock = proxies["value"], proxies["lock"]

        def increment() -> None:
            with lock:
                value.value += 1

        return _loop(increment, seconds)
    if kind == "dict-get":
        shared = proxies["dict"]
        return _loop(lambda: shared["key"], seconds)
    if kind == "lock":
        lock = proxies["lock"]

        def pair() -> None:
            lock.acquire()
            lock.release()

        return _loop(pair, seconds)
    queue = proxies["queue"]

    def put_get() -> None:
        queue.put(1)
        queue.get(timeout=5)

    return _loop(put_get, seconds)
