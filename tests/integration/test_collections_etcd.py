"""The collections against a real etcd (TLS, client-certificate auth) on a loopback address.

etcd is started by the project's own launcher CLI, exactly as the head node's bootstrap does,
and other OS processes (spawned, and one forked) act as the other nodes of a pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import pytest

from skyward_iac import collections as sky_collections
from skyward_iac.collections import Backend, BackendConfig, CollectionError, connect, context, pki
from skyward_iac.collections.client import EtcdClient
from skyward_iac.node import etcd_server as server

pytestmark = pytest.mark.integration
T = TypeVar("T")


@dataclass(frozen=True)
class Etcd:
    endpoint: str
    data_dir: Path
    certs_dir: Path
    bundle: pki.ClusterCertificates
    launch: list[str]

    def config(self, job_id: str = "job-a", **overrides: object) -> BackendConfig:
        base = BackendConfig(
            endpoints=(self.endpoint,), job_id=job_id, ca_pem=self.bundle.ca_pem,
            cert_pem=self.bundle.client_cert_pem, key_pem=self.bundle.client_key_pem,
        )
        return replace(base, **overrides)  # type: ignore[arg-type]


def _free_loopback() -> tuple[str, int, int]:
    rng = random.SystemRandom()
    for _ in range(100):
        address = f"127.0.{rng.randint(1, 254)}.{rng.randint(2, 254)}"
        ports = []
        try:
            for _ in range(2):
                with socket.socket() as probe:
                    probe.bind((address, 0))
                    ports.append(probe.getsockname()[1])
        except OSError:
            continue
        if ports[0] != ports[1]:
            return address, ports[0], ports[1]
    raise RuntimeError("no free loopback address")


def _launch(argv: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "skyward_iac.node", "etcd-server", *argv],
                          input=stdin, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    """A real etcd started by the launcher CLI on a random 127.0.x.y; stopped (and checked)."""
    root = tmp_path_factory.mktemp("etcd")
    address, client_port, peer_port = _free_loopback()
    bundle = pki.generate_cluster_certificates("itest", [address])
    argv = ["--data-dir", str(root / "data"), "--listen", address, "--client-port",
            str(client_port), "--peer-port", str(peer_port), "--certs-dir", str(root / "certs"),
            "--timeout", "20"]
    pems = json.dumps({"ca_pem": bundle.ca_pem, "cert_pem": bundle.server_cert_pem,
                       "key_pem": bundle.server_key_pem})
    result = _launch([*argv, "--certs-stdin"], pems)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{server.ENDPOINT_LINE} {address}:{client_port}"]
    pid = server.running_pid(root / "data")
    assert pid is not None
    yield Etcd(f"{address}:{client_port}", root / "data", root / "certs", bundle, argv)
    assert server.stop(root / "data") is True
    assert server.running_pid(root / "data") is None
    state = Path(f"/proc/{pid}/stat")
    assert not state.exists() or state.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    with pytest.raises(OSError):
        socket.create_connection((address, client_port), timeout=1).close()
    assert server.stop(root / "data") is False  # nothing left to stop


@pytest.fixture(scope="module")
def backend(etcd: Etcd) -> Iterator[Backend]:
    with connect(etcd.config()) as one:
        yield one


@pytest.fixture(scope="module")
def nodes() -> Iterator[ProcessPoolExecutor]:
    """Four spawned OS processes playing the other nodes (reused across tests)."""
    with ProcessPoolExecutor(max_workers=4, mp_context=mp.get_context("spawn")) as executor:
        list(executor.map(_warm, range(8)))
        yield executor


# -- what the other "nodes" run (module level: spawned children import this module) --------

_child_backends: dict[BackendConfig, Backend] = {}


def _child(config: BackendConfig) -> Backend:
    if config not in _child_backends:
        _child_backends[config] = connect(config)
        context.set_process_default(_child_backends[config])
    return _child_backends[config]


def _warm(_: int) -> int:
    time.sleep(0.2)  # keep this worker busy so the others get spawned too
    return os.getpid()


def _increments(config: BackendConfig, name: str, m: int) -> int:
    _child(config)
    counter = sky_collections.counter(name, consistency="strong")
    for _ in range(m):
        counter.increment()
    return os.getpid()


def _critical_sections(config: BackendConfig, name: str, rounds: int) -> list[tuple[float, float]]:
    _child(config)
    spans = []
    for _ in range(rounds):
        with sky_collections.lock(name, timeout=30):
            start = time.monotonic()  # CLOCK_MONOTONIC is system-wide: comparable across processes
            time.sleep(0.02)
            spans.append((start, time.monotonic()))
    return spans


def _produce(config: BackendConfig, name: str, count: int) -> None:
    _child(config)
    queue = sky_collections.queue(name)
    for item in range(count):
        queue.put(item)


def _consume(config: BackendConfig, name: str) -> list[int]:
    _child(config)
    queue, got = sky_collections.queue(name), []
    while (item := queue.get(timeout=2.0)) is not None:
        got.append(item)
    return got


def _meet(config: BackendConfig, name: str, n: int, delay: float) -> tuple[float, float, int]:
    _child(config)
    time.sleep(delay)
    arrived = time.monotonic()
    index = sky_collections.barrier(name, n).wait(timeout=20)
    return arrived, time.monotonic(), index


def _hold_lock_forever(config: BackendConfig, name: str, ready: mp.synchronize.Event) -> None:
    _child(config)
    sky_collections.lock(name).acquire()
    ready.set()
    time.sleep(600)


# -- the launcher and TLS ------------------------------------------------------------------


def test_certificates_on_disk_are_private(etcd: Etcd) -> None:
    assert etcd.certs_dir.stat().st_mode & 0o777 == 0o700
    for name in (server.CA_FILE, server.CERT_FILE, server.KEY_FILE):
        assert (etcd.certs_dir / name).stat().st_mode & 0o777 == 0o600
    assert etcd.data_dir.stat().st_mode & 0o777 == 0o700


def test_relaunch_only_rechecks_health(etcd: Etcd) -> None:
    pid = server.running_pid(etcd.data_dir)
    result = _launch(etcd.launch, "")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{server.ENDPOINT_LINE} {etcd.endpoint}"
    assert server.running_pid(etcd.data_dir) == pid


def test_failed_start_exits_nonzero_with_log_tail(etcd: Etcd, tmp_path: Path) -> None:
    host, port = etcd.endpoint.rsplit(":", 1)
    argv = ["--data-dir", str(tmp_path / "data"), "--listen", host, "--client-port", port,
            "--peer-port", str(_free_loopback()[2]), "--certs-dir", str(etcd.certs_dir),
            "--timeout", "10"]
    result = _launch(argv, "")
    assert result.returncode != 0
    assert result.stdout == ""
    assert "Address already in use" in result.stderr
    assert server.running_pid(tmp_path / "data") is None


def test_etcd_that_dies_at_startup_reports_its_log(etcd: Etcd, tmp_path: Path) -> None:
    broken = tmp_path / "certs"
    broken.mkdir()
    for name in (server.CA_FILE, server.CERT_FILE):
        (broken / name).write_text((etcd.certs_dir / name).read_text())
    (broken / server.KEY_FILE).write_text("not a key\n")  # etcd itself must refuse this
    address, client_port, peer_port = _free_loopback()
    argv = ["--data-dir", str(tmp_path / "data"), "--listen", address, "--client-port",
            str(client_port), "--peer-port", str(peer_port), "--certs-dir", str(broken),
            "--timeout", "10"]
    result = _launch(argv, "")
    assert result.returncode != 0 and result.stdout == ""
    assert "exited during startup" in result.stderr
    assert "etcd.log ---" in result.stderr and len(result.stderr.splitlines()) > 2
    assert "not a key" not in result.stderr  # the key file's content never reaches a log


def test_etcd_refuses_clients_without_the_clusters_certificate(etcd: Etcd) -> None:
    foreign_ca = pki.generate_ca("someone-else")
    foreign = pki.issue_client_certificate(foreign_ca)
    attempts = {
        "no client certificate": (None, None),
        "certificate from another CA": (foreign.cert_pem, foreign.key_pem),
    }
    for what, (cert, key) in attempts.items():
        with EtcdClient([etcd.endpoint], ca_pem=etcd.bundle.ca_pem, cert_pem=cert, key_pem=key,
                        timeout=3) as client, pytest.raises(CollectionError, match="unreachable"):
            client.range("/skyward/")
            pytest.fail(f"etcd served a client with {what}")
    # The same refusal at the TLS layer: the server itself rejects the handshake.
    host, port = etcd.endpoint.rsplit(":", 1)
    tls = ssl.create_default_context(cadata=etcd.bundle.ca_pem)
    tls.check_hostname = False
    with (
        socket.create_connection((host, int(port)), timeout=3) as raw,
        pytest.raises((ssl.SSLError, ConnectionError)),
        tls.wrap_socket(raw, server_hostname=pki.SERVER_NAME) as conn,
    ):
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        if not conn.recv(1024):  # TLS 1.3: the alert arrives on the first read
            raise ConnectionError("closed by server")
    # And the cluster's own client certificate is served.
    with connect(etcd.config()) as ok:
        assert ok.ping().startswith("3.5")


def test_cluster_pki_resource_in_a_real_stack() -> None:
    """ClusterPKI through the real engine: keys secret in outputs and state, replaced on move."""
    import pulumi
    import pulumi.automation as auto

    from skyward_iac.api.errors import EngineNotFoundError
    from skyward_iac.infra.engine import locate as engine
    from skyward_iac.infra.identity.cluster_pki import ClusterPKI
    from skyward_iac.infra.stacks import home

    try:
        found = engine.find_engine()
    except EngineNotFoundError as exc:
        pytest.skip(str(exc))
    addresses = ["10.0.0.1", "head"]

    def program() -> None:
        bundle = ClusterPKI("pki", stack="pki-itest", server_addresses=list(addresses))
        for output in ("ca_pem", "server_cert_pem", "server_key_pem", "client_cert_pem",
                       "client_key_pem"):
            pulumi.export(output, getattr(bundle, output))

    opts = auto.LocalWorkspaceOptions(
        work_dir=str(home.workspace_dir()), pulumi_command=auto.PulumiCommand(root=str(found.root)),
        env_vars=engine.engine_env(found),
        project_settings=auto.ProjectSettings(
            name="skyward-pki-itest", runtime="python",
            backend=auto.ProjectBackend(url=f"file://{home.state_dir()}")),
    )
    stack = auto.create_stack(f"pki-{os.getpid()}", project_name="skyward-pki-itest",
                              program=program, opts=opts)
    try:
        first = stack.up().outputs
        assert {k for k, v in first.items() if v.secret} == {"server_key_pem", "client_key_pem"}
        addresses.reverse()
        again = stack.up()
        assert again.summary.resource_changes == {"same": 2}
        addresses[:] = ["10.0.0.2"]
        moved = stack.up()
        assert moved.summary.resource_changes == {"replace": 1, "same": 1}
        assert moved.outputs["ca_pem"].value != first["ca_pem"].value
        key_line = moved.outputs["server_key_pem"].value.splitlines()[1]
        state = next(Path(home.state_dir()).rglob(f"pki-{os.getpid()}.json")).read_text()
        assert key_line not in state and "PRIVATE KEY" not in state
    finally:
        stack.destroy()
        stack.workspace.remove_stack(stack.name)


# -- dict, set, namespaces, consistency ----------------------------------------------------


def test_namespaces_isolate_jobs(etcd: Etcd) -> None:
    with connect(etcd.config("job-x")) as a, connect(etcd.config("job-y")) as b:
        a.dict("shared", consistency="strong")["k"] = "from x"
        b.set("seen", consistency="strong").add(1)
        assert "k" not in b.dict("shared", consistency="strong")
        assert b.dict("shared").get("k") is None
        assert len(a.set("seen", consistency="strong")) == 0
        assert a.dict("shared")["k"] == "from x"
        assert len(a.client.range(a.namespace.prefix, prefix=True, keys_only=True).kvs) == 1


def test_strong_dict_and_set_read_your_writes_across_clients(etcd: Etcd) -> None:
    with connect(etcd.config()) as one, connect(etcd.config()) as two:
        mine, theirs = one.dict("ryw", consistency="strong"), two.dict("ryw", consistency="strong")
        for i in range(20):
            mine[("k", i)] = {"v": i}
            assert theirs[("k", i)] == {"v": i}  # no waiting: linearizable
        theirs.update({"a": 1, "b": lambda x: x + 1})
        assert mine["a"] == 1 and mine["b"](1) == 2
        assert mine.pop("a") == 1 and "a" not in theirs and theirs.pop("a", "gone") == "gone"
        del theirs[("k", 0)]
        with pytest.raises(KeyError):
            mine[("k", 0)]
        with pytest.raises(KeyError):
            del mine[("k", 0)]
        assert mine.get(("k", 0), -1) == -1
        mine["big"] = b"x" * (4 << 20)  # larger than etcd's default request limit
        assert len(theirs["big"]) == 4 << 20
        s1, s2 = one.set("ryw", consistency="strong"), two.set("ryw", consistency="strong")
        s1.add("x")
        s1.add("x")
        s1.add(1)
        assert "x" in s2 and 1 in s2 and 1.0 not in s2 and len(s2) == 2
        s2.discard("x")
        s2.discard("never there")
        assert "x" not in s1 and len(s1) == 1


def test_eventual_reads_converge_and_are_much_faster_than_strong(etcd: Etcd) -> None:
    with connect(etcd.config()) as reader_b, connect(etcd.config()) as writer_b:
        reader, writer = reader_b.dict("ev"), writer_b.dict("ev", consistency="strong")
        assert reader.get("k") is None  # replica synced, watching
        writer["k"] = "v1"
        deadline = time.monotonic() + 5
        while reader.get("k") != "v1":
            assert time.monotonic() < deadline, "eventual read did not converge within 5s"
            time.sleep(0.005)
        del writer["k"]
        while "k" in reader:
            assert time.monotonic() < deadline, "eventual delete did not converge"
            time.sleep(0.005)
        reader["mine"] = 1  # read-your-writes on the writer's own replica: no wait at all
        assert reader["mine"] == 1
        seen, counter = reader_b.set("ev"), reader_b.counter("ev")
        seen.add("a")
        assert "a" in seen and len(seen) == 1
        counter.increment(3)
        assert counter.value == 3

        strong = reader_b.dict("ev", consistency="strong")
        reads = 200
        started = time.perf_counter()
        for _ in range(reads):
            strong.get("mine")
        strong_each = (time.perf_counter() - started) / reads
        started = time.perf_counter()
        for _ in range(reads * 10):
            reader.get("mine")
        eventual_each = (time.perf_counter() - started) / (reads * 10)
        print(f"\nget: strong {1 / strong_each:,.0f}/s, eventual {1 / eventual_each:,.0f}/s")
        assert eventual_each * 20 < strong_each


# -- counter ---------------------------------------------------------------------------------


def test_counter_threads_and_processes_never_lose_an_increment(
    etcd: Etcd, backend: Backend, nodes: ProcessPoolExecutor
) -> None:
    threads, m = 4, 50
    counter = backend.counter("threads", consistency="strong")

    def work() -> None:
        for _ in range(m):
            counter.increment()

    started = time.perf_counter()
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    rate = threads * m / (time.perf_counter() - started)
    assert counter.value == threads * m
    print(f"\nstrong increments, {threads} threads: {rate:,.0f}/s")

    procs, m = 3, 100
    pids = list(nodes.map(_increments, [etcd.config()] * procs, ["procs"] * procs, [m] * procs))
    assert len(set(pids)) >= 2, "the increments must come from at least two OS processes"
    assert backend.counter("procs", consistency="strong").value == procs * m
    assert int(backend.counter("procs")) == procs * m  # eventual reader agrees once synced
    c = backend.counter("reset", consistency="strong")
    c.reset(10)
    assert c.decrement(4) == 6 and int(c) == 6


# -- lock ------------------------------------------------------------------------------------


def test_lock_critical_sections_never_overlap_across_processes(
    etcd: Etcd, nodes: ProcessPoolExecutor
) -> None:
    procs, rounds = 3, 6
    results = nodes.map(_critical_sections, [etcd.config()] * procs, ["cs"] * procs,
                        [rounds] * procs)
    spans = sorted(span for result in results for span in result)
    assert len(spans) == procs * rounds
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, "two critical sections overlapped"


def test_lock_times_out_and_is_released_when_its_holder_is_killed(etcd: Etcd) -> None:
    config = etcd.config(lease_ttl=2)
    ready = mp.get_context("spawn").Event()
    holder = mp.get_context("spawn").Process(target=_hold_lock_forever,
                                             args=(config, "doomed", ready))
    holder.start()
    try:
        assert ready.wait(30), "the holder never acquired the lock"
        with connect(config) as other:
            lock = other.lock("doomed", timeout=0.5)
            with pytest.raises(TimeoutError, match="still held"):
                lock.acquire()
            assert holder.pid is not None
            os.kill(holder.pid, signal.SIGKILL)
            holder.join(5)
            killed = time.monotonic()
            assert lock.acquire(timeout=15)
            waited = time.monotonic() - killed
            lock.release()
    finally:
        if holder.is_alive():
            holder.kill()
    print(f"\nlock freed {waited:.1f}s after its holder was SIGKILLed (lease ttl 2s)")
    assert 0.5 < waited < 10  # freed by the lease expiring, not by anyone releasing it


def test_a_lock_acquired_through_one_proxy_is_released_through_another(backend: Backend) -> None:
    backend.lock("handoff", timeout=5).acquire()
    backend.lock("handoff", timeout=5).release()  # another proxy, same thread: its holder
    with pytest.raises(RuntimeError, match="not held"):
        backend.lock("handoff", timeout=5).release()
    assert backend.lock("handoff", timeout=1).acquire()  # it was really released
    backend.lock("handoff").release()


def _count_rpcs(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the KV RPCs ``backend`` makes from now on, in order."""
    stub = backend.client._etcd.kvstub
    calls: list[str] = []
    for name in ("Range", "Put", "DeleteRange", "Txn"):
        method = getattr(stub, name)
        monkeypatch.setattr(stub, name, lambda *a, _m=method, _n=name, **k: (
            calls.append(_n), _m(*a, **k))[1])
    return calls


def test_an_uncontended_lock_pair_is_two_round_trips(
    backend: Backend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock = backend.lock("two-trips", timeout=5)
    lock.acquire()  # the process's lease is granted once, on first use
    lock.release()
    calls = _count_rpcs(backend, monkeypatch)
    with backend.lock("two-trips", timeout=5):
        assert calls == ["Txn"]  # the claim and the look at the contenders, together
    assert calls == ["Txn", "DeleteRange"]


# -- queue -----------------------------------------------------------------------------------


def test_queue_delivers_every_item_exactly_once(
    etcd: Etcd, backend: Backend, nodes: ProcessPoolExecutor
) -> None:
    q = backend.queue("fifo")
    for item in ("a", "b", "c"):
        q.put(item)
    assert len(q) == 3 and not q.empty()
    assert [q.get(), q.get(), q.get()] == ["a", "b", "c"]
    assert q.empty() and q.get(timeout=0.2) is None

    count, consumers = 150, 3
    config = etcd.config()
    taken = [nodes.submit(_consume, config, "work") for _ in range(consumers)]
    nodes.submit(_produce, config, "work", count).result(timeout=60)
    got = [future.result(timeout=60) for future in taken]
    flat = [item for items in got for item in items]
    assert sorted(flat) == list(range(count)), "an item was lost or delivered twice"
    assert sum(1 for items in got if items) >= 2, "expected the work to be shared"
    for items in got:
        assert items == sorted(items)  # FIFO as seen by each consumer


def test_a_backlog_drains_in_one_round_trip_per_item(
    etcd: Etcd, backend: Backend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with connect(etcd.config()) as other:  # another process's items: none is known here
        producer = other.queue("backlog")
        for item in range(40):
            producer.put(item)
    calls = _count_rpcs(backend, monkeypatch)
    # A fresh proxy per get, as `sky.queue("backlog").get()` in a loop makes: one listing each
    # 16 items is shared by the process, whatever the proxy.
    assert [backend.queue("backlog").get(timeout=1) for _ in range(40)] == list(range(40))
    assert calls.count("Txn") == 40 and calls.count("Range") == 3, calls


def test_a_put_then_a_get_are_two_round_trips(
    backend: Backend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = backend.queue("pairs")
    calls = _count_rpcs(backend, monkeypatch)
    for item in range(5):
        queue.put(item)
        assert queue.get(timeout=1) == item
    assert calls == ["Txn", "Txn"] * 5  # the put (if its reused key is free), the claim


def test_an_own_item_waits_for_older_items_of_others(
    etcd: Etcd, backend: Backend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with connect(etcd.config()) as other:
        other.queue("order").put("theirs, first")
        queue = backend.queue("order")
        queue.put("mine, second")
        calls = _count_rpcs(backend, monkeypatch)
        # The claim of our own item fails (an older one exists) and lists the queue instead.
        assert queue.get(timeout=1) == "theirs, first"
        assert queue.get(timeout=1) == "mine, second"
        assert calls == ["Txn", "Txn", "Txn"]
        other.queue("order").put("theirs, third")
        assert queue.get(timeout=1) == "theirs, third"
        assert queue.get(timeout=0) is None


def test_threads_of_one_process_share_the_listing_and_keep_fifo(backend: Backend) -> None:
    count = 200
    producer = backend.queue("threads")
    for item in range(count):
        producer.put(item)
    got: list[list[int]] = [[] for _ in range(4)]

    def consume(mine: list[int]) -> None:
        queue = backend.queue("threads")
        while (item := queue.get(timeout=0.5)) is not None:
            mine.append(item)

    threads = [threading.Thread(target=consume, args=(mine,)) for mine in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(item for mine in got for item in mine) == list(range(count))
    for mine in got:
        assert mine == sorted(mine)


# -- barrier ---------------------------------------------------------------------------------


def test_barrier_releases_nobody_before_the_nth_arrives(
    etcd: Etcd, backend: Backend, nodes: ProcessPoolExecutor
) -> None:
    n = 3
    results = list(nodes.map(_meet, [etcd.config()] * n, ["gate"] * n, [n] * n,
                             [0.0, 0.4, 0.8]))
    last_arrival = max(arrived for arrived, _, _ in results)
    first_leave = min(left for _, left, _ in results)
    assert first_leave >= last_arrival
    assert sorted(index for _, _, index in results) == [0, 1, 2]

    # Cyclic: the same barrier serves a second round without a reset.
    b = backend.barrier("gate2", 2)
    for _ in range(2):
        assert sorted(_concurrently(2, lambda: b.wait(timeout=10))) == [0, 1]


def test_barrier_without_enough_participants_times_out_and_stays_usable(backend: Backend) -> None:
    b = backend.barrier("lonely", 2)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="only 1 of 2"):
        b.wait(timeout=0.5)
    assert 0.5 <= time.monotonic() - started < 5
    # The timed-out arrival was withdrawn: a full round still works.
    assert sorted(_concurrently(2, lambda: b.wait(timeout=10))) == [0, 1]


# -- async twins, contexts, child processes ------------------------------------------------


def test_async_twins(backend: Backend) -> None:
    async def scenario() -> list[object]:
        d, c, q, s = (backend.dict("aio"), backend.counter("aio", consistency="strong"),
                      backend.queue("aio"), backend.set("aio"))
        await d.set_async("k", 1)
        await asyncio.gather(*(c.increment_async() for _ in range(10)))
        await q.put_async("item")
        await s.add_async("m")
        async with backend.lock("aio"):
            inside = await d.get_async("k")
        return [inside, await c.value_async(), await q.get_async(timeout=1),
                await s.contains_async("m"), await d.pop_async("k"), await q.empty_async()]

    assert asyncio.run(scenario()) == [1, 10, "item", True, 1, True]


def test_factories_resolve_the_bound_backend(etcd: Etcd) -> None:
    with connect(etcd.config("job-ctx")) as bound:
        token = context.bind(bound)
        try:
            sky_collections.dict("d", consistency="strong")["k"] = 1
            assert bound.dict("d", consistency="strong")["k"] == 1
        finally:
            context.unbind(token)
    # A fresh context: a pool another test left bound for the session must not answer here.
    with pytest.raises(RuntimeError, match="No active pool"):
        contextvars.Context().run(sky_collections.dict, "d")


def test_forked_child_reconnects_from_the_parents_config(etcd: Etcd) -> None:
    parent = connect(etcd.config("job-fork"))
    context.set_process_default(parent)
    try:
        parent.counter("forked", consistency="strong").increment()  # gRPC in use before fork
        child = mp.get_context("fork").Process(target=_increments_in_fork, args=("forked", 50))
        # Forked from a fresh context: a pool another test left bound must not be inherited.
        contextvars.Context().run(child.start)
        child.join(30)
        assert child.exitcode == 0
        assert parent.counter("forked", consistency="strong").value == 51
    finally:
        context.set_process_default(None)
        parent.close()


def _increments_in_fork(name: str, m: int) -> None:
    backend = context.current()  # the parent's default, rebuilt for this process
    assert backend.pid == os.getpid()
    for _ in range(m):
        sky_collections.counter(name, consistency="strong").increment()


def _concurrently(n: int, fn: Callable[[], T]) -> list[T]:
    """Runs ``fn`` on ``n`` threads at once; returns the results or raises the first error."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(fn())
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    if errors:
        raise errors[0]
    return results


_PINGS_WHILE_CLOSING = """
import sys, threading
from skyward_iac.collections.client import EtcdClient
from skyward_iac.api.errors import CollectionError
endpoint, ca, cert, key = sys.argv[1], *(open(p).read() for p in sys.argv[2:5])
refused = 0
for _ in range(20):
    client = EtcdClient([endpoint], ca_pem=ca, cert_pem=cert, key_pem=key, timeout=5)
    stop = threading.Event()
    errors = []
    def ping():
        while not stop.is_set():
            try:
                client.server_version()
            except CollectionError as exc:
                errors.append(str(exc))
                return
    pingers = [threading.Thread(target=ping) for _ in range(4)]
    for thread in pingers:
        thread.start()
    client.server_version()
    client.close()
    stop.set()
    for thread in pingers:
        thread.join()
    refused += sum("connection to etcd is closed" in error for error in errors)
print(refused)
"""


def test_closing_a_client_while_other_threads_call_it_never_crashes(etcd: Etcd,
                                                                     tmp_path: Path) -> None:
    # CI, 2026-11-26: a pool's collections watcher pinged etcd while the pool's close closed
    # the channel, and gRPC crashed the process (SIGSEGV in _get_registered_call_handle).
    files = []
    for name, text in (("ca", etcd.bundle.ca_pem), ("cert", etcd.bundle.client_cert_pem),
                       ("key", etcd.bundle.client_key_pem)):
        (tmp_path / name).write_text(text)
        files.append(str(tmp_path / name))
    run = subprocess.run([sys.executable, "-c", _PINGS_WHILE_CLOSING, etcd.endpoint, *files],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout) >= 20  # every round, calls after close were refused with words
