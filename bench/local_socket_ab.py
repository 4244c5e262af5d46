"""A Local node's paths to the same agent, alternated: its Unix socket (large buffers as memfds,
or as bytes) and its TLS data port.

    .venv/bin/python bench/local_socket_ab.py [--rounds 6] [--calls 500] [--no-tls]

One real 1-node Local pool (numpy on the node); three ``AgentClient``s of this process reach its
agent at once: two over the local socket (remote/data_port.py ``connect_local``), one handing
large buffers over as sealed memfds (remote/fd_channel.py), one made with
``SKYWARD_LOCAL_DESCRIPTORS=0`` (their bytes through the socket, as before), and one over the
TLS data port (``connect``, the stack's server pair as a client certificate, as the tests do).
Each round gives each path, in turn (the order rotates every round, so load from elsewhere
hits all alike), ``--calls`` sequential no-op round trips and one call carrying a fresh
100 MiB float64 array (its sum checked). Printed per path: the median of the rounds' p50, the
client process's CPU per no-op call (``time.process_time``, every thread of this process) and
the 100 MiB figure in MB/s (MB = 2**20 bytes), with each round's values, the CPU that call
cost the client process, the agent and its workers (``/proc``, 10 ms ticks: medians), and the
load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np

import skyward_iac as sky
from skyward_iac.node import protocol
from skyward_iac.remote import data_port, fd_channel
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.bootstrap import LOCAL_SOCKET_FILE

MIB = 1 << 20


def noop(x: int) -> int:
    return x


def total(array: Any) -> float:
    return float(array.sum())


def clients(pool: Any) -> dict[str, AgentClient]:
    """The node's agent reached over each path."""
    node = pool.nodes[0]
    workdir = Path(node.address.workdir)
    token = (workdir / "agent.token").read_text().strip()
    tls = workdir / "tls"
    # etcd's server pair, which the agent presents, also carries clientAuth: a stack member.
    certificate = data_port.IssuedCertificate(*((tls / name).read_text() for name in
                                                ("ca.crt", "server.crt", "server.key")))
    port = data_port.announced_port(node.connection, node.address.workdir, 30)
    assert port is not None, "the agent announced no data port"
    local = data_port.connect_local(workdir / LOCAL_SOCKET_FILE)
    remote = data_port.connect(node.address.public_address, port,
                               data_port.client_context(certificate))
    handing = AgentClient(local, token, 0)
    os.environ[fd_channel.ENABLED_ENV] = "0"  # read as the client is made
    try:
        as_bytes = AgentClient(data_port.connect_local(workdir / LOCAL_SOCKET_FILE), token, 0)
    finally:
        del os.environ[fd_channel.ENABLED_ENV]
    return {"local socket, memfds": handing, "local socket, bytes": as_bytes,
            "TLS": AgentClient(remote, token, 0)}


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process ``pid`` and of all its descendants."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(process: int) -> float:
        fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    def children(process: int) -> list[int]:
        found = []
        for task in Path(f"/proc/{process}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
        return found

    todo, below = children(pid), 0.0
    while todo:
        process = todo.pop()
        try:
            below += own(process)
            todo += children(process)
        except (FileNotFoundError, ProcessLookupError):
            pass
    return own(pid), below


def one_round(client: AgentClient, calls: int, serial: int,
              agent: int) -> tuple[float, float, float, float, float, float]:
    """p50 (ms) and client CPU per call (µs) of ``calls`` no-ops, then one fresh 100 MiB
    call's MB/s and the CPU (ms) it cost this process, the agent and its workers."""
    walls = []
    cpu = time.process_time()
    for i in range(calls):
        began = time.perf_counter()
        client.submit("noop", protocol.dumps((noop, (i,), {})), timeout=60).result(60)
        walls.append(time.perf_counter() - began)
    cpu_us = (time.process_time() - cpu) / calls * 1e6
    count = 100 * MIB // 8
    array = np.arange(serial * count, (serial + 1) * count, dtype=np.float64)
    expected = float(array.sum())
    cpu, (agent_cpu, workers_cpu) = time.process_time(), cpu_seconds(agent)
    began = time.perf_counter()
    payload, buffers = protocol.dumps_with_buffers((total, (array,), {}))
    got = client.submit("total", payload, 120, buffers).result(120)
    rate = array.nbytes / MIB / (time.perf_counter() - began)
    client_ms = (time.process_time() - cpu) * 1e3
    agent_after, workers_after = cpu_seconds(agent)
    assert got == expected, "a wrong sum"
    return (statistics.median(walls) * 1e3, cpu_us, rate, client_ms,
            (agent_after - agent_cpu) * 1e3, (workers_after - workers_cpu) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--no-tls", action="store_true",
                        help="the two local-socket paths alone (each then follows the other)")
    args = parser.parse_args()
    image = sky.Image(pip=("--offline", "numpy==2.4.6"))  # as bench/systems.py's pools
    with sky.Compute(provider=sky.Local(), nodes=1, image=image,
                     options=sky.Options(console=False)) as pool:
        paths = clients(pool)
        if args.no_tls:
            paths.pop("TLS").close()
        agent = int((Path(pool.nodes[0].address.workdir) / "run" / "agent.pid").read_text())
        try:
            for client in paths.values():  # warm-up, numpy imported by the workers included
                for i in range(200):
                    client.submit("noop", protocol.dumps((noop, (i,), {})), timeout=60).result(60)
                for _ in range(3):
                    small = protocol.dumps_with_buffers((total, (np.ones(MIB),), {}))
                    assert client.submit("total", *small[:1], 60, small[1]).result(60) == MIB
            results: dict[str, list[tuple[float, ...]]] = {name: [] for name in paths}
            serial = 0
            for turn in range(args.rounds):
                names = list(paths)
                for name in names[turn % len(names):] + names[:turn % len(names)]:
                    results[name].append(one_round(paths[name], args.calls, serial, agent))
                    serial += 1
        finally:
            for client in paths.values():
                client.close()
    for name, rounds in results.items():
        p50s, cpus, rates, client_ms, agent_ms, workers_ms = zip(*rounds, strict=True)
        print(f"{name}: p50 {statistics.median(p50s):.3f} ms "
              f"({' '.join(f'{x:.3f}' for x in p50s)}), client CPU "
              f"{statistics.median(cpus):.0f} µs/call, 100 MiB {statistics.median(rates):.0f} "
              f"MB/s ({' '.join(f'{x:.0f}' for x in rates)}), its CPU: client "
              f"{statistics.median(client_ms):.0f} ms, agent {statistics.median(agent_ms):.0f} ms, "
              f"workers {statistics.median(workers_ms):.0f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
