"""Distributed collections on a real 3-node Local pool: etcd on the head, TLS, every node."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.collections import BackendConfig, connect
from skyward_iac.collections.pki import generate_cluster_certificates
from skyward_iac.node.etcd_binary import etcd_binary, etcd_version_text
from skyward_iac.node.etcd_server import GRPC_SOCKET
from skyward_iac.orchestration.collections import built_etcd
from skyward_iac.remote.bootstrap import ETCD_DATA, ETCD_UPLOADED, EtcdServerPlan
from skyward_iac.remote.bootstrap_run import file_digest, ship_etcd

NODES = 3


@pytest.fixture(scope="module")
def cluster() -> Iterator[sky.Pool]:
    options = sky.Options(worker=sky.Worker(concurrency=2), default_compute_timeout=120)
    with sky.Compute(provider=sky.Local(), nodes=NODES, options=options) as pool:
        yield pool


@sky.function
def increment(name: str, times: int) -> int:
    counter = sky.counter(name, consistency="strong")
    for _ in range(times):
        counter.increment()
    return sky.instance_info().node  # type: ignore[union-attr]


def test_counter_is_exact_across_nodes(cluster: sky.Pool) -> None:
    nodes = increment("hits", 50) @ cluster
    assert nodes == [0, 1, 2]
    assert cluster.counter("hits", consistency="strong").value == NODES * 50
    assert int(sky.counter("hits")) == NODES * 50  # the client's view inside the block


@sky.function
def critical_sections(name: str, rounds: int) -> list[tuple[float, float, int]]:
    node = sky.instance_info().node  # type: ignore[union-attr]
    spans = []
    for _ in range(rounds):
        with sky.lock(name):
            started = time.time()
            time.sleep(0.02)
            spans.append((started, time.time(), node))
    return spans


def test_lock_sections_never_overlap_across_nodes(cluster: sky.Pool) -> None:
    spans = sorted(s for node_spans in critical_sections("mutex", 8) @ cluster for s in node_spans)
    assert len(spans) == NODES * 8 and {s[2] for s in spans} == {0, 1, 2}
    for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
        assert start >= end, "two nodes held the lock at once"


@sky.function
def produce(name: str, count: int) -> int:
    queue = sky.queue(name)
    for item in range(count):
        queue.put(item)
    return count


@sky.function
def consume(name: str) -> list[int]:
    queue, taken = sky.queue(name), []
    while (item := queue.get(timeout=2)) is not None:
        taken.append(item)
    return taken


def test_queue_delivers_every_item_exactly_once(cluster: sky.Pool) -> None:
    results = sky.gather(produce("jobs", 120), consume("jobs"), consume("jobs"),
                         consume("jobs")) >> cluster
    delivered = [item for taken in results[1:] for item in taken]
    assert sorted(delivered) == list(range(120))
    assert cluster.queue("jobs").empty() and len(cluster.queue("jobs")) == 0


@sky.function
def meet(name: str) -> tuple[float, float]:
    node = sky.instance_info().node  # type: ignore[union-attr]
    time.sleep(0.3 * node)  # arrive at different times
    arrived = time.time()
    sky.barrier(name, NODES).wait()
    return arrived, time.time()


def test_barrier_releases_nobody_before_the_last_arrives(cluster: sky.Pool) -> None:
    times = meet("sync") @ cluster
    last_arrival = max(arrived for arrived, _ in times)
    assert all(left >= last_arrival for _, left in times)


@sky.function
def write_then_read_elsewhere(key: str) -> None:
    sky.dict("shared", consistency="strong")[key] = sky.instance_info().node  # type: ignore[union-attr]
    sky.set("members", consistency="strong").add(key)


@sky.function
def read_strong(key: str) -> tuple[object, bool, int]:
    shared, members = sky.dict("shared", consistency="strong"), sky.set("members", consistency="strong")
    return shared.get(key), key in members, len(members)


@sky.function
def read_eventually(key: str, deadline: float) -> tuple[object, int]:
    shared = sky.dict("shared")  # eventual: a watched local cache
    reads = 0
    while (value := shared.get(key)) is None and time.time() < deadline:
        reads += 1
        time.sleep(0.01)
    for _ in range(2000):  # repeated reads are served locally
        shared.get(key)
    return value, reads


def test_dict_and_set_read_your_writes_across_nodes_and_eventual_converges(
    cluster: sky.Pool,
) -> None:
    cluster.run(write_then_read_elsewhere("alpha"), target=0)
    assert cluster.run(read_strong("alpha"), target=2) == (0, True, 1)
    value, _ = cluster.run(read_eventually("alpha", time.time() + 10), target=1)
    assert value == 0
    cluster.dict("shared").update({"beta": 42})  # a write from the client
    value, _ = cluster.run(read_eventually("beta", time.time() + 10), target=2)
    assert value == 42
    assert cluster.dict("shared", consistency="strong").pop("beta") == 42


def test_process_executor_sees_the_same_collections() -> None:
    options = sky.Options(worker=sky.Worker(concurrency=2, executor="process"))
    with sky.Compute(provider=sky.Local(), nodes=1, options=options) as pool:
        sky.gather(*[increment("proc", 25) for _ in range(4)]) >> pool
        assert pool.counter("proc").value == 100


@sky.function
def try_counter() -> str:
    try:
        sky.counter("nope")
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_cluster_false_disables_collections_with_the_reason() -> None:
    with sky.Compute(provider=sky.Local(), nodes=1, options=sky.Options(cluster=False)) as pool:
        assert "Options(cluster=False)" in (try_counter() >> pool)
        with pytest.raises(RuntimeError, match="cluster=False"):
            pool.counter("nope")


def test_etcd_refuses_a_client_without_the_cluster_certificate(cluster: sky.Pool) -> None:
    stranger = generate_cluster_certificates("stranger", ["127.0.0.1"])
    endpoint = f"{cluster.nodes[0].address.private_address}:2379"
    config = BackendConfig(endpoints=(endpoint,), job_id=cluster.stack_name, ca_pem=stranger.ca_pem,
                           cert_pem=stranger.client_cert_pem, key_pem=stranger.client_key_pem,
                           timeout=3)
    with pytest.raises(sky.CollectionError):
        with connect(config) as backend:
            backend.counter("hits", consistency="strong").value


@sky.function
def etcd_endpoint(name: str) -> str:
    from skyward_iac.collections import context

    backend = context.current()
    backend.counter(name, consistency="strong").increment()  # through that endpoint
    return backend.config.endpoints[0]


def test_local_tasks_reach_etcd_on_the_heads_private_socket(cluster: sky.Pool) -> None:
    """Every node of a Local pool is this machine's, as this user: its tasks use the head's
    plain gRPC socket in etcd's 0700 data dir instead of TLS over loopback; the head runs the
    etcd scripts/setup built when there is one, else the wheel's."""
    head = next(node for node in cluster.nodes if node.address.index == 0)
    data = Path(head.address.workdir) / ETCD_DATA
    path = data / GRPC_SOCKET
    assert etcd_endpoint("via-socket") @ cluster == [f"unix:{path}"] * NODES
    assert cluster.counter("via-socket", consistency="strong").value == NODES
    assert stat.S_ISSOCK(path.stat().st_mode)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    pid = int((data / "etcd.pid").read_text())
    assert os.readlink(f"/proc/{pid}/exe") == (built_etcd() or etcd_binary()[0])


def test_a_cloud_head_that_runs_the_build_gets_a_copy_once(cluster: sky.Pool) -> None:
    """What the bootstrap does for a cloud head with the client's OS and CPU (over a Local
    node's real SSH): the client's etcd build is uploaded, runs there, is kept after, and is
    sent again when the copy there is another build (by its recorded SHA-256)."""
    binary = built_etcd()
    if binary is None:
        pytest.skip("no etcd build here: scripts/setup builds one (tools/etcd/build.sh)")
    node = cluster.nodes[1]
    workdir = node.address.workdir + "/etcd-upload"
    node.connection.run(f"mkdir -p {workdir}", hide=True, in_stream=False)
    cloud = EtcdServerPlan("10.0.0.5", "CA", "CERT", "KEY", binary=binary)
    sftp = node.connection.client.open_sftp()  # fabric's cached one was closed by the bootstrap
    try:
        shipped = ship_etcd(sftp, workdir, cloud, "x86_64")
        first = sftp.stat(f"{workdir}/{ETCD_UPLOADED}").st_mtime
        assert ship_etcd(sftp, workdir, cloud, "x86_64") == shipped  # kept, not sent again
        assert sftp.stat(f"{workdir}/{ETCD_UPLOADED}").st_mtime == first
        # Another build there at the same size (its head overwritten, another digest on
        # record): sent again, so the --version below runs the client's build.
        with sftp.open(f"{workdir}/{ETCD_UPLOADED}", "r+b") as there:
            there.write(b"\0" * 64)
        with sftp.open(f"{workdir}/{ETCD_UPLOADED}.sha256", "wb") as there:
            there.write(b"0" * 64)
        assert ship_etcd(sftp, workdir, cloud, "x86_64") == shipped
        assert sftp.stat(f"{workdir}/{ETCD_UPLOADED}").st_size == os.path.getsize(binary)
        with sftp.open(f"{workdir}/{ETCD_UPLOADED}.sha256", "rb") as there:
            assert there.read().decode() == file_digest(binary)
    finally:
        sftp.close()
    assert shipped.binary == f"{workdir}/{ETCD_UPLOADED}"
    said = node.connection.run(f"{shipped.binary} --version", hide=True, in_stream=False).stdout
    assert said.splitlines()[0] == f"etcd Version: {etcd_version_text(binary)}"
