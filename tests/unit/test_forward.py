"""``LocalForward`` over a real SSH connection: a paramiko server in this process stands in
for a node's sshd (direct-tcpip to real local sockets), so each failure can be made exactly.
The real sshd and etcd are in tests/chaos/test_etcd_loss.py."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import paramiko
import pytest

from skyward_iac.remote.forward import LocalForward, Trouble, check, classify, open_channel
from tests.agent_process import wait_until
from tests.helpers import http_get_as_nobody


class _Sshd(paramiko.ServerInterface):
    """Accepts anyone (``none`` auth) and connects direct-tcpip channels as sshd does."""

    def __init__(self) -> None:
        self.targets: dict[int, socket.socket] = {}

    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_auth_none(self, username: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_direct_tcpip_request(self, chanid: int, origin: tuple[str, int],
                                           destination: tuple[str, int]) -> int:
        try:
            self.targets[chanid] = socket.create_connection(destination, timeout=2)
        except OSError:
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        return paramiko.OPEN_SUCCEEDED


def _pump(source: socket.socket | paramiko.Channel, sink: socket.socket | paramiko.Channel) -> None:
    """Copy until the source ends, then pass its end on (a half close, as sshd does)."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
        if isinstance(sink, socket.socket):
            sink.shutdown(socket.SHUT_WR)
        else:
            sink.shutdown_write()
    except (OSError, EOFError):
        source.close()
        sink.close()


class Node:
    """Both ends of one SSH connection, the server's channels wired to their targets."""

    def __init__(self) -> None:
        server_sock, client_sock = socket.socketpair()
        self.server = paramiko.Transport(server_sock)
        self.server.add_server_key(paramiko.ECDSAKey.generate())
        self.sshd = _Sshd()
        self.server.start_server(threading.Event(), server=self.sshd)  # negotiates meanwhile
        self.client = paramiko.Transport(client_sock)
        self.client.start_client(timeout=10)
        self.client.auth_none("skyward")
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while (channel := self.server.accept()) is not None:
            target = self.sshd.targets.pop(channel.get_id())
            threading.Thread(target=_pump, args=(channel, target), daemon=True).start()
            threading.Thread(target=_pump, args=(target, channel), daemon=True).start()

    def close(self) -> None:
        self.client.close()
        self.server.close()


class Echo:
    """A TCP server that echoes, and can drop its connections or stop listening."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(sock)
            threading.Thread(target=_pump, args=(sock, sock), daemon=True).start()

    def drop(self) -> None:
        for sock in self.connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()
        self.drop()


@pytest.fixture
def node() -> Iterator[Node]:
    node = Node()
    yield node
    node.close()


@pytest.fixture
def echo() -> Iterator[Echo]:
    echo = Echo()
    yield echo
    echo.close()


class Troubles(list[tuple[Trouble, str]]):
    def __call__(self, trouble: Trouble, detail: str) -> None:
        self.append((trouble, detail))


def closed_at_once(port: int) -> bool:
    """A connection to ``port`` is accepted and closed without a byte, well within 5 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.settimeout(5)
        try:
            return sock.recv(1) == b""
        except ConnectionResetError:
            return True


def round_trip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def test_bytes_cross_both_ways_and_a_client_that_ends_is_no_trouble(node: Node,
                                                                    echo: Echo) -> None:
    troubles = Troubles()
    forward = LocalForward(lambda: node.client, ("127.0.0.1", echo.port), troubles)
    payload = bytes(range(256)) * 8192  # 2 MiB, many chunks and window adjustments
    assert round_trip(forward.port, payload) == payload
    assert round_trip(forward.port, b"again") == b"again"
    time.sleep(0.2)
    assert troubles == []  # the client closed first: the far end's close that follows is normal
    forward.close()
    forward.close()


def test_every_forward_serves_this_user_only(node: Node, echo: Echo) -> None:
    # No accept check is passed, as the collections' tunnel to etcd passes none: another local
    # user is closed before anything reaches the node; this user is served.
    forward = LocalForward(lambda: node.client, ("127.0.0.1", echo.port), Troubles())
    assert http_get_as_nobody(forward.port) in ("b''", "reset")
    assert forward.rejected == 1
    assert round_trip(forward.port, b"mine") == b"mine"
    forward.close()


def test_a_refused_channel_fails_that_connection_only(node: Node) -> None:
    """Fabric's forward died on the first refused channel; later connections then hung."""
    spare = socket.create_server(("127.0.0.1", 0))
    port = spare.getsockname()[1]
    spare.close()  # nothing listens on ``port`` now
    troubles = Troubles()
    forward = LocalForward(lambda: node.client, ("127.0.0.1", port), troubles)
    assert closed_at_once(forward.port)
    assert [t for t, _ in troubles] == [Trouble.REFUSED]
    listening = socket.create_server(("127.0.0.1", port))  # the target is back
    threading.Thread(target=lambda: _pump(*(2 * [listening.accept()[0]])), daemon=True).start()
    assert round_trip(forward.port, b"still forwarding") == b"still forwarding"
    listening.close()
    forward.close()


def test_the_far_end_closing_a_live_connection_is_reported(node: Node, echo: Echo) -> None:
    troubles = Troubles()
    forward = LocalForward(lambda: node.client, ("127.0.0.1", echo.port), troubles)
    with socket.create_connection(("127.0.0.1", forward.port), timeout=5) as sock:
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        echo.drop()  # the target dies under a live connection
        assert sock.recv(1) == b""  # the client sees it end
    assert wait_until(lambda: troubles, 5)
    assert [t for t, _ in troubles] == [Trouble.CLOSED_BY_TARGET]
    forward.close()


def test_refuse_closes_open_and_new_connections_at_once(node: Node, echo: Echo) -> None:
    troubles = Troubles()
    forward = LocalForward(lambda: node.client, ("127.0.0.1", echo.port), troubles)
    sock = socket.create_connection(("127.0.0.1", forward.port), timeout=5)
    sock.sendall(b"x")
    assert sock.recv(1) == b"x"
    forward.refuse()
    assert sock.recv(1) == b""
    sock.close()
    assert closed_at_once(forward.port)
    assert troubles == []  # refusing is the owner's decision, not a new trouble
    forward.close()


def test_a_lost_ssh_connection_is_reported_and_closing_never_raises(node: Node,
                                                                    echo: Echo) -> None:
    troubles = Troubles()
    forward = LocalForward(lambda: node.client, ("127.0.0.1", echo.port), troubles)
    assert round_trip(forward.port, b"up") == b"up"
    node.close()
    assert closed_at_once(forward.port)
    assert Trouble.SSH_LOST in [t for t, _ in troubles]
    forward.close()
    with pytest.raises(paramiko.SSHException, match="closed"):
        open_channel(None, ("127.0.0.1", echo.port), 1)


def test_classify() -> None:
    assert classify(paramiko.ChannelException(2, "Connect failed")) is Trouble.REFUSED
    assert classify(paramiko.SSHException("gone")) is Trouble.SSH_LOST
    assert classify(EOFError()) is Trouble.SSH_LOST


def test_check_tells_a_listening_target_from_a_dying_or_gone_one(node: Node, echo: Echo) -> None:
    assert check(node.client, ("127.0.0.1", echo.port), 5, settle=0.2) is None  # waits for us
    dying = socket.create_server(("127.0.0.1", 0))  # accepts, then resets: a process exiting
    address = dying.getsockname()
    threading.Thread(target=lambda: dying.accept()[0].close(), daemon=True).start()
    assert check(node.client, address, 5, settle=2) == (
        Trouble.REFUSED, "it closed a new connection at once")
    dying.close()
    trouble, _ = check(node.client, address, 5) or (None, "")
    assert trouble is Trouble.REFUSED  # nothing listens any more
    assert check(None, ("127.0.0.1", echo.port), 5) == (Trouble.SSH_LOST,
                                                         "the SSH connection is closed")
