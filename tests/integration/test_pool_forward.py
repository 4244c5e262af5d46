"""``pool.forward``: a server a task started on node 0 reached from the client through a local
port that serves this user only (a connection from user ``nobody`` is closed)."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks import access
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.helpers import http_get_as_nobody

pytestmark = pytest.mark.integration

SERVER = """
import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@sky.function
def start_server(page: str) -> tuple[int, int]:
    """Serve ``page`` over HTTP on the node's loopback, in a process that outlives the task;
    (its pid, its port)."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp())
    (root / "index.html").write_text(page)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(root)],
                              stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    # (No assert in a task: pytest rewrites it into an import of its own.)
    return server.pid, int(server.stdout.readline())  # type: ignore[union-attr]


@sky.function
def stop(pid: int) -> None:
    import os
    import signal

    os.kill(pid, signal.SIGTERM)
    os.waitpid(pid, 0)


def test_forward_reaches_a_server_a_task_started_and_refuses_another_user(
        pool: sky.Pool) -> None:
    pid, port = pool.run(start_server("<h1>from node 0</h1>"), target=0)
    try:
        with pool.forward(port) as local:
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=30) as page:
                assert page.read() == b"<h1>from node 0</h1>"
            assert http_get_as_nobody(local) in ("b''", "reset")  # closed, nothing served
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=30) as page:
                assert page.status == 200  # this user is still served
    finally:
        pool.run(stop(pid), target=0)
    with pytest.raises(OSError):  # the with block closed the port
        socket.create_connection(("127.0.0.1", local), timeout=5).close()
    # Recorded in the stack's access log as `skyward-iac forward` is (written in a thread).
    action = f"forward node 0 port {port} to 127.0.0.1:{local} (pool.forward)"
    stack = ClusterStack.select(pool.stack_name)
    deadline = time.monotonic() + 60
    while not (found := [e for e in access.entries(stack.tags()) if e.action == action]):
        assert time.monotonic() < deadline, f"no access entry {action!r}"
        time.sleep(0.5)
    assert found[0].by == access.actor()


def test_a_port_nothing_listens_on_fails_each_connection_fast(pool: sky.Pool) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        unused = probe.getsockname()[1]
    with pool.forward(unused, node="head") as local:
        with socket.create_connection(("127.0.0.1", local), timeout=30) as client:
            client.settimeout(30)
            assert client.recv(10) == b""  # closed at once, not left to time out


@pytest.mark.parametrize(("args", "kwargs"), [
    ((0,), {}), ((70000,), {}), ((8080,), {"node": 9}), ((8080,), {"local_port": -1}),
    (("8080",), {}), ((8080,), {"node": None}),
])
def test_bad_ports_and_nodes_are_config_errors(pool: sky.Pool, args: tuple[object, ...],
                                               kwargs: dict[str, object]) -> None:
    with pytest.raises(sky.ConfigError), pool.forward(*args, **kwargs):  # type: ignore[arg-type]
        pass
