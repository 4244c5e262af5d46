"""Where a large argument's time goes: bare TCP and bare TLS 1.3 (the data port's mutual TLS,
one ``sendall`` into ``recv_into``: the ceilings), the wire protocol's frames over one loopback
TCP hop, the agent's relay of the bytes path (TCP in, socket pair out to a worker; the agent in a
process of its own, cut-through and store-and-forward), and a whole call through a real agent's
data port (``--agent``: a fresh array each round, as figure 3 sends; the CPU each process
spent, from /proc, which the machine's load moves far less than MB/s). Interleaved, so the load
hits them alike. MB/s (MB = 2**20 bytes), median of ``--rounds``.

    .venv/bin/python bench/wire_stages.py [--megabytes 100] [--rounds 5] [--agent]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import ssl
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import agent_call
import numpy as np

from skyward_iac.collections import pki
from skyward_iac.node import data_port, protocol, relay
from skyward_iac.node.etcd_server import write_certificates
from skyward_iac.node.messages import Task
from skyward_iac.remote import data_port as client_port


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    server.close()
    return client, accepted


def _timed(send: Callable[[], None], receive: Callable[[], None]) -> float:
    """Seconds from the first byte sent to the last byte received."""
    done: list[float] = []
    reader = threading.Thread(target=lambda: (receive(), done.append(time.perf_counter())))
    reader.start()
    start = time.perf_counter()
    send()
    reader.join()
    return done[0] - start


def bare(data: memoryview) -> float:
    """A fresh buffer per call, as the floor and the protocol allocate one per frame."""
    client, server = _tcp_pair()

    def receive() -> None:
        buffer, got = memoryview(bytearray(data.nbytes)), 0
        while got < data.nbytes:
            got += server.recv_into(buffer[got:])

    with client, server:
        return _timed(lambda: client.sendall(data), receive)


def _tls_pair(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> tuple[socket.socket,
                                                                         socket.socket]:
    """A TLS 1.3 connection as the data port makes one (client certificate, pinned name)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    acceptor = threading.Thread(target=lambda: accepted.append(
        contexts[1].wrap_socket(server.accept()[0], server_side=True)))
    acceptor.start()
    client = client_port.connect("127.0.0.1", server.getsockname()[1], contexts[0])
    acceptor.join()
    server.close()
    return client, accepted[0]


def bare_tls(data: memoryview, contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> float:
    """As ``bare``, over the data port's TLS: its ceiling in this process pair's threads."""
    client, server = _tls_pair(contexts)

    def receive() -> None:
        buffer, got = memoryview(bytearray(data.nbytes)), 0
        while got < data.nbytes:
            got += server.recv_into(buffer[got:], min(data.nbytes - got, 1 << 20))

    with client, server:
        return _timed(lambda: client.sendall(data), receive)


def tls_contexts(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The client's and the agent's TLS contexts from a fresh stack PKI written in ``folder``."""
    bundle = pki.generate_cluster_certificates("wire-stages", ["127.0.0.1"])
    write_certificates(folder, bundle.server)
    ours = client_port.client_context(client_port.IssuedCertificate(
        bundle.ca_pem, bundle.client_cert_pem, bundle.client_key_pem))
    return ours, data_port.server_context(folder)


def framed(task: Task) -> float:
    client, server = _tcp_pair()
    with client, server:
        return _timed(lambda: protocol.Channel(client).send(task),
                      lambda: protocol.Channel(server).receive())


def relayed(task: Task, cut_through: bool) -> float:
    """Client -> agent (TCP) -> worker (socket pair), the agent in a process of its own: its
    bytes path (``cut_through``: buffers forwarded as they arrive, node/relay.py; what a buffer
    under 1 MiB takes, a larger one goes as a memfd: see ``--agent``) or store-and-forward (the
    whole frame read, then sent on)."""
    client, agent_in = _tcp_pair()
    agent_out, worker = socket.socketpair()
    forwarder = multiprocessing.get_context("fork").Process(
        target=_agent, args=(agent_in, agent_out, cut_through, (client, worker)))
    forwarder.start()
    agent_in.close()
    agent_out.close()
    try:
        return _timed(lambda: protocol.Channel(client).send(task),
                      lambda: protocol.Channel(worker).receive())
    finally:
        client.close()
        forwarder.join()
        worker.close()


def _agent(agent_in: socket.socket, agent_out: socket.socket, cut_through: bool,
           others: tuple[socket.socket, ...]) -> None:
    for sock in others:  # the forked copies, so the client's close reaches this process
        sock.close()
    inbound, outbound = protocol.Channel(agent_in), protocol.Channel(agent_out)
    if not cut_through:
        outbound.send_many(inbound.receive())
        return
    try:
        relay.serve(inbound, outbound.send_many)
    except protocol.ConnectionClosed:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--agent", action="store_true",
                        help="also a whole call through a real agent's data port")
    args = parser.parse_args()
    array = np.arange(args.megabytes * 2**20 // 8, dtype=np.float64)
    data = memoryview(array).cast("B")
    task = Task(1, "f", b"call", None, (data,))
    folder = Path(tempfile.mkdtemp(prefix="skyward-stages-"))
    contexts = tls_contexts(folder / "tls")
    stages: dict[str, Callable[[], float]] = {
        "bare TCP, one hop": lambda: bare(data),
        "bare TLS 1.3, one hop": lambda: bare_tls(data, contexts),
        "frames, one TCP hop": lambda: framed(task),
        "relay, store-and-forward": lambda: relayed(task, cut_through=False),
        "relay, cut-through (bytes path)": lambda: relayed(task, cut_through=True),
    }
    calling = agent_call.AgentCall(folder, contexts[0]) if args.agent else nullcontext()
    with calling as through:
        if through is not None:
            stages["a call through a real agent's data port"] = lambda: through.call(args.megabytes)
        rates: dict[str, list[float]] = {name: [] for name in stages}
        for _ in range(args.rounds):
            for name, stage in stages.items():
                rates[name].append(args.megabytes / stage())
    for name, values in rates.items():
        print(f"{name:40s} {statistics.median(values):7.0f} MB/s  "
              f"(runs {', '.join(f'{v:.0f}' for v in sorted(values))})")
    if through is not None:
        print(through.cpu_summary())



if __name__ == "__main__":
    main()
