"""Where a large argument's time goes without SSH: the wire protocol's frames over one
loopback TCP hop, the agent's relay (TCP in, socket pair out to a worker; the agent in a
process of its own, cut-through as it is now and store-and-forward as it was) and bare TCP
(one ``sendall`` into one ``recv_into``) beside them, interleaved so the machine's load hits
them alike. MB/s (MB = 2**20 bytes), median of ``--rounds``.

    .venv/bin/python bench/wire_stages.py [--megabytes 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import threading
import time
from collections.abc import Callable

import numpy as np

from skyward_iac.node import protocol, relay
from skyward_iac.node.messages import Task


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


def framed(task: Task) -> float:
    client, server = _tcp_pair()
    with client, server:
        return _timed(lambda: protocol.Channel(client).send(task),
                      lambda: protocol.Channel(server).receive())


def relayed(task: Task, cut_through: bool) -> float:
    """Client -> agent (TCP) -> worker (socket pair), as a task travels on a Local node, the
    agent in a process of its own: its relay as it is (``cut_through``: buffers forwarded as
    they arrive, node/relay.py) or store-and-forward (the whole frame read, then sent on)."""
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
    args = parser.parse_args()
    array = np.arange(args.megabytes * 2**20 // 8, dtype=np.float64)
    data = memoryview(array).cast("B")
    task = Task(1, "f", b"call", None, (data,))
    stages: dict[str, Callable[[], float]] = {
        "bare TCP, one hop": lambda: bare(data),
        "frames, one TCP hop": lambda: framed(task),
        "relay, store-and-forward": lambda: relayed(task, cut_through=False),
        "relay, cut-through (the agent's)": lambda: relayed(task, cut_through=True),
    }
    rates: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(args.rounds):
        for name, stage in stages.items():
            rates[name].append(args.megabytes / stage())
    for name, values in rates.items():
        print(f"{name:38s} {statistics.median(values):7.0f} MB/s  "
              f"(runs {', '.join(f'{v:.0f}' for v in sorted(values))})")


if __name__ == "__main__":
    main()
