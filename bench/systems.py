"""skyward_iac and its peers behind one interface (``common.System``), plus each one's shared
state primitives for the collections figure."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import workloads

#: Items each node is sent ahead of its running task (``sky.Worker(buffer=...)``): the
#: default, "auto", paces each node (skyward_iac/remote/pacing.py); run.py also measures
#: fixed ones.
SKYWARD_BUFFER: int | str = "auto"
#: numpy on the nodes for the bulk figure. ``--offline``: a Local node's SSH session does not
#: inherit this machine's CA settings, and scripts/setup already put numpy in the uv cache.
NODE_PACKAGES = ["--offline", "numpy==2.4.6"]

Rates = dict[str, float | None]


class Skyward:
    """A Local pool of ``workers`` nodes (real engine, sshd and agents), one slot per node."""

    name = "skyward"
    #: ``Options.console`` of the measured pool (``run.py --console``): the default shows the
    #: log console, since the bench's stderr is a pipe.
    console: bool | str = True

    def __init__(self, buffer: int | str = SKYWARD_BUFFER,
                 packages: list[str] | None = None) -> None:
        self.buffer = buffer
        self.packages = NODE_PACKAGES if packages is None else packages
        self._compute: Any = None
        self._functions: dict[Callable[..., Any], Any] = {}

    def start(self, workers: int = 2) -> None:
        import skyward_iac as sky

        options = sky.Options(worker=sky.Worker(concurrency=1, buffer=self.buffer),
                              console=self.console)
        compute = sky.Compute(provider=sky.Local(), nodes=workers, options=options,
                              image=sky.Image(pip=tuple(self.packages)))
        self.pool = compute.__enter__()  # a failed start destroys its own stack
        self._compute = compute

    def stop(self) -> None:
        if self._compute is not None:
            self._compute.__exit__(None, None, None)
            self._compute = None

    def _remote(self, fn: Callable[..., Any]) -> Any:
        import skyward_iac as sky

        if fn not in self._functions:
            self._functions[fn] = sky.function(fn)
        return self._functions[fn]

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.pool.run(self._remote(fn)(*args))

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        return self.pool.map(self._remote(fn), items)

    def collections(self, seconds: float) -> Rates:
        """Collections from inside tasks: the counter from every node at once, the rest per
        node (dict gets: the mean of the nodes; lock and queue: the head node alone)."""
        pool = self.pool
        counter = self._remote(workloads.sky_counter)("bench-counter", seconds) @ pool
        strong = self._remote(workloads.sky_dict_get)("bench-strong", "strong", seconds) @ pool
        eventual = self._remote(workloads.sky_dict_get)("bench-eventual", "eventual", seconds) @ pool
        lock = pool.run(self._remote(workloads.sky_lock)("bench-lock", seconds), target="head")
        contended = self._remote(workloads.sky_lock)("bench-lock-2", seconds) @ pool
        queue = pool.run(self._remote(workloads.sky_queue)("bench-queue", seconds), target="head")
        return {"counter": sum(counter), "dict-strong": sum(strong) / len(strong),
                "dict-eventual": sum(eventual) / len(eventual), "lock": lock,
                "lock-contended": sum(contended), "queue": queue}


class SkywardTls(Skyward):
    """The same Local pool reached as a cloud node is: each agent over its TLS data port
    (``SKYWARD_LOCAL_SOCKET=0``, remote/data_port.py) and the head's etcd from tasks over TLS
    on TCP (``SKYWARD_ETCD_SOCKET=0``, orchestration/collections.py), both read while the
    pool starts. skyward's own figures are the same-host paths' (Unix sockets); this one
    keeps the cloud-like figure beside them in the same run."""

    name = "skyward-tls"

    def start(self, workers: int = 2) -> None:
        from skyward_iac.orchestration.collections import ETCD_SOCKET_ENV
        from skyward_iac.remote.data_port import LOCAL_SOCKET_ENV

        names = (LOCAL_SOCKET_ENV, ETCD_SOCKET_ENV)
        before = {name: os.environ.get(name) for name in names}
        os.environ.update({name: "0" for name in names})
        try:
            super().start(workers)
        finally:  # read while nodes attach: the other systems' pools are unaffected
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class Ray:
    """``ray.init(num_cpus=workers)``: tasks, and an actor for shared state."""

    name = "ray"

    def start(self, workers: int = 2) -> None:
        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # no token file in ~/.ray for a bench
        self._ray = ray  # set first: stop() after a failed init still shuts Ray down
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        self._tasks: dict[Callable[..., Any], Any] = {}

    def stop(self) -> None:
        self._ray.shutdown()

    def _remote(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._tasks:
            self._tasks[fn] = self._ray.remote(fn)
        return self._tasks[fn]

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._ray.get(self._remote(fn).remote(*args))

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        task = self._remote(fn)
        return self._ray.get([task.remote(item) for item in items])

    def collections(self, seconds: float) -> Rates:
        """An actor's counter and dict (Ray has no lock), and ``ray.util.queue.Queue``."""
        from ray.util.queue import Queue

        state = self._ray.remote(workloads.RayState).remote()
        op = self._remote(workloads.ray_actor_op)
        counter = self._ray.get([op.remote(state, "increment", seconds) for _ in range(2)])
        gets = self._ray.get([op.remote(state, "get", seconds) for _ in range(2)])
        queue = self._ray.get(self._remote(workloads.ray_queue).remote(Queue(), seconds))
        return {"counter": sum(counter), "dict-strong": sum(gets) / 2, "dict-eventual": None,
                "lock": None, "lock-contended": None, "queue": queue}


class Dask:
    """Dask distributed ``LocalCluster(n_workers=workers, threads_per_worker=1)``."""

    name = "dask"

    def start(self, workers: int = 2) -> None:
        from distributed import Client, LocalCluster

        self._cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                     dashboard_address=None)
        self._client = Client(self._cluster)

    def stop(self) -> None:
        self._client.close()
        self._cluster.close()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._client.submit(fn, *args, pure=False).result()

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        return self._client.gather(self._client.map(fn, items, pure=False))

    def collections(self, seconds: float) -> Rates:
        """``distributed.Variable`` gets, ``Lock``, ``Queue`` (Dask has no atomic counter)."""
        submit, workers = self._client.submit, list(self._client.scheduler_info()["workers"])
        gets = [submit(workloads.dask_op, "dict-get", "v", seconds, pure=False,
                       workers=[w]) for w in workers]
        rates = self._client.gather(gets)
        lock = submit(workloads.dask_op, "lock", "l", seconds, pure=False).result()
        contended = self._client.gather([submit(workloads.dask_op, "lock", "l2", seconds,
                                                pure=False, workers=[w]) for w in workers])
        queue = submit(workloads.dask_op, "queue", "q", seconds, pure=False).result()
        return {"counter": None, "dict-strong": sum(rates) / len(rates), "dict-eventual": None,
                "lock": lock, "lock-contended": sum(contended), "queue": queue}


class ProcessPool:
    """``concurrent.futures.ProcessPoolExecutor(workers)``; shared state through a
    ``multiprocessing.Manager``."""

    name = "processpool"

    def start(self, workers: int = 2) -> None:
        self._executor = ProcessPoolExecutor(workers)

    def stop(self) -> None:
        self._executor.shutdown()

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._executor.submit(fn, *args).result()

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        futures = [self._executor.submit(fn, item) for item in items]
        return [future.result() for future in futures]

    def collections(self, seconds: float) -> Rates:
        """Manager proxies: a Value under a Lock, a dict, a Lock, a Queue."""
        with multiprocessing.Manager() as manager:
            proxies = {"value": manager.Value("i", 0), "lock": manager.Lock(),
                       "dict": manager.dict(key="value"), "queue": manager.Queue()}
            submit = self._executor.submit
            counter = [submit(workloads.manager_op, "counter", proxies, seconds) for _ in range(2)]
            gets = [submit(workloads.manager_op, "dict-get", proxies, seconds) for _ in range(2)]
            counter_rates = [f.result() for f in counter]
            get_rates = [f.result() for f in gets]
            lock = submit(workloads.manager_op, "lock", proxies, seconds).result()
            both = [submit(workloads.manager_op, "lock", proxies, seconds) for _ in range(2)]
            contended = sum(f.result() for f in both)
            queue = submit(workloads.manager_op, "queue", proxies, seconds).result()
        return {"counter": sum(counter_rates), "dict-strong": sum(get_rates) / 2,
                "dict-eventual": None, "lock": lock, "lock-contended": contended, "queue": queue}
