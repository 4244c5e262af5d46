"""SSH for bootstrap and fallback only, on a real Local pool: a node whose agent is reached over
its local socket (or data port) has no SSH connection from the client once it is in service (the head keeps its
own, which carries the collections tunnel); its heartbeat reaches the watchdog's file over the
agent connection; a fence, a forwarded port or the volumes' unmount open SSH again when they
need it; and the pool's close leaves no agent connection of the client open."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import fabric
import pytest
from invoke.exceptions import CommandTimedOut

import skyward_iac as sky
from skyward_iac.infra.stacks.home import local_nodes_dir
from skyward_iac.orchestration.node import Node
from skyward_iac.processes import sandbox_processes
from skyward_iac.remote import data_port
from tests.agent_process import connections_to, wait_until

pytestmark = pytest.mark.integration
TTL = 6


@sky.function
def square(x: int) -> int:
    return x * x


def sshd_sessions(stack: str, index: int) -> list[int]:
    """The node's sshd processes serving a connection (one per client connection)."""
    sandbox = local_nodes_dir() / stack / f"node-{index}"
    found = []
    for pid in sandbox_processes(sandbox):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd: root@notty"):
                found.append(pid)
        except OSError:
            pass  # gone meanwhile
    return found


def beat_count(node: Node) -> int:
    text = (Path(node.address.workdir) / "heartbeat").read_text()
    return int(text.split()[1]) if text.startswith("beat ") else 0


def test_the_pools_close_leaves_no_agent_connection_of_the_client() -> None:
    # First in the module: no other pool of this file is open yet.
    before_threads = set(threading.enumerate())
    with sky.Compute(provider=sky.Local(), nodes=1,
                     options=sky.Options(console=False)) as one:
        assert square(4) >> one == 16
        [node] = one.nodes
        assert node.path == data_port.LOCAL_SOCKET
        stream = node.agent._channel.stream
        address = node.address.public_address
        assert connections_to(address) == 1  # SSH (the collections tunnel); the agent's is Unix
    assert node.agent.closed and stream.fileno() == -1, "the local socket outlived its pool"
    assert connections_to(address) == 0, "a connection to the node outlived its pool"
    assert wait_until(lambda: not [t for t in set(threading.enumerate()) - before_threads
                                   if t.name.startswith("agent-") and t.is_alive()], 10), \
        "an agent client's thread outlived its pool"


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    with sky.Compute(provider=sky.Local(), nodes=2, ttl=TTL,
                     options=sky.Options(console=False, default_compute_timeout=60)) as started:
        yield started


def test_only_the_head_keeps_an_ssh_connection_once_in_service(pool: sky.Pool) -> None:
    head, worker = pool.nodes
    assert head.path == worker.path == data_port.LOCAL_SOCKET
    assert worker.connection.held is None and head.connection.held is not None
    assert wait_until(lambda: len(sshd_sessions(pool.stack_name, 1)) == 0, 10), \
        "node 1 still has an SSH session from the client"
    assert len(sshd_sessions(pool.stack_name, 0)) == 1  # the collections tunnel's
    # This process's TCP connections to each node (other pools of the process aside): the
    # head's SSH alone, none to the other (both agents are reached over their Unix socket).
    assert connections_to(head.address.public_address) == 1
    assert connections_to(worker.address.public_address) == 0
    assert [square(x) >> pool for x in range(4)] == [0, 1, 4, 9]


def test_the_heartbeat_reaches_the_watchdogs_file_over_the_agent_connection(
        pool: sky.Pool) -> None:
    worker = pool.nodes[1]
    first = beat_count(worker)
    # A beat every ttl/3 = 2 s, each one the next count, with no SSH connection to the node:
    # and the node outlives several ttls (its watchdog would stop it after TTL s of silence).
    assert wait_until(lambda: beat_count(worker) >= first + 2, 3 * TTL), \
        f"the beat count stayed at {beat_count(worker)}"
    assert not sshd_sessions(pool.stack_name, 1)
    time.sleep(TTL)
    assert pool.nodes[1] is worker and square(3) >> pool == 9
    assert square(2) @ pool == [4, 4]


def test_a_port_is_forwarded_to_a_node_without_an_ssh_connection(pool: sky.Pool) -> None:
    worker = pool.nodes[1]
    assert worker.connection.held is None
    # A Local node's loopback is this machine's: what a task would have started on it.
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pool.forward(server.server_address[1], node=1) as port, \
                socket.create_connection(("127.0.0.1", port), 10) as sock:
            sock.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.0 200")
    finally:
        server.shutdown()
        server.server_close()
    assert worker.connection.held is not None  # opened again for the forward


def test_a_command_killed_at_its_timeout_says_so_even_while_the_kill_is_under_way(
        pool: sky.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """invoke judged a run timed out by its timer thread having ended: a run that returned while
    the timer was still closing the channel looked like exit code -1, and a bootstrap that ran
    out of time said "failed" instead of "timed out" (CI, 2026-11-26)."""
    closing = fabric.runners.Remote.kill

    def slow_kill(runner: fabric.runners.Remote) -> None:
        closing(runner)
        time.sleep(1.5)  # the timer thread is still in kill when the run returns

    monkeypatch.setattr(fabric.runners.Remote, "kill", slow_kill)
    connection = pool.nodes[0].connection.open()
    started = time.monotonic()
    with pytest.raises(CommandTimedOut):
        connection.run("sleep 30", hide=True, warn=True, in_stream=False, timeout=1)
    assert time.monotonic() - started < 10
    assert connection.run("echo still here", hide=True, in_stream=False).stdout == "still here\n"


def test_a_node_without_an_ssh_connection_is_fenced_and_replaced(pool: sky.Pool) -> None:
    worker = pool.nodes[1]
    worker.connection.release()  # as after the forward above
    pid = int((Path(worker.address.workdir) / "run" / "agent.pid").read_text())
    fenced = worker.fence(timeout=30)
    # The kill can only have come over a new SSH connection (the node's was released). The
    # pool, seeing the agent connection break, fences and closes the node itself, which may
    # end this call's connection before it reports: then the node was let go meanwhile.
    assert fenced or worker.letting_go.is_set(), "fencing over a new SSH connection failed"
    assert not Path(f"/proc/{pid}").exists() or \
        Path(f"/proc/{pid}/status").read_text().find("State:\tZ") >= 0
    # Its agent connection broke with it: the node leaves service and is replaced.
    assert wait_until(lambda: len(pool.nodes) == 2 and pool.nodes[1] is not worker, 120)
    assert square(5) @ pool == [25, 25]
