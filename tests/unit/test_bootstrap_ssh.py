"""SSH to a node that is still booting: attempts retry on a real loopback port until an SSH
server answers, and a wrong host key is refused at once."""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Iterator

import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from skyward_iac.api.errors import HostKeyMismatchError, NodeConnectionError
from skyward_iac.outputs import NodeAddress
from skyward_iac.remote import ssh


def new_key() -> tuple[str, paramiko.Ed25519Key]:
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption()).decode()
    return pem, paramiko.Ed25519Key.from_private_key(io.StringIO(pem))


def free_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def address(port: int, host_key: paramiko.PKey) -> NodeAddress:
    return NodeAddress(index=0, private_address="127.0.0.1", public_address="127.0.0.1",
                       ssh_port=port, ssh_user="skyward",
                       host_key=f"{host_key.get_name()} {host_key.get_base64()}", workdir="/w")


class AcceptKey(paramiko.ServerInterface):
    def __init__(self, key: paramiko.PKey) -> None:
        self.key = key

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL if key == self.key else paramiko.AUTH_FAILED


@pytest.fixture
def late_server() -> Iterator[tuple[int, paramiko.Ed25519Key, str, float]]:
    """An SSH server (paramiko) that starts listening only ``delay`` seconds from now."""
    port, delay = free_port(), 1.0
    _, host_key = new_key()
    client_pem, client_key = new_key()
    transports: list[paramiko.Transport] = []
    stop = threading.Event()

    def serve() -> None:
        time.sleep(delay)
        with socket.socket() as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", port))
            listener.listen()
            listener.settimeout(0.2)
            while not stop.is_set():
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    continue
                transport = paramiko.Transport(sock)
                transport.add_server_key(host_key)
                transport.start_server(server=AcceptKey(client_key))
                transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield port, host_key, client_pem, delay
    stop.set()
    for transport in transports:
        transport.close()


def test_a_closed_port_is_retried_until_the_deadline() -> None:
    pem, key = new_key()
    started = time.monotonic()
    with pytest.raises(NodeConnectionError) as caught:
        ssh.connect(address(free_port(), key), pem, timeout=5, wait=1.5, retry_interval=0.2)
    elapsed = time.monotonic() - started
    assert 1.2 <= elapsed < 5
    message = str(caught.value)
    attempts = int(message.split(" attempt(s)")[0].rsplit(" ", 1)[1])
    assert attempts >= 4, message
    assert "Options.ssh_timeout" in message


def test_connection_succeeds_once_the_node_boots(
        late_server: tuple[int, paramiko.Ed25519Key, str, float]) -> None:
    port, host_key, pem, delay = late_server
    started = time.monotonic()
    conn = ssh.connect(address(port, host_key), pem, timeout=5, wait=15, retry_interval=0.2)
    try:
        assert time.monotonic() - started >= delay * 0.9
        assert conn.is_connected and conn.transport.is_authenticated()
    finally:
        conn.close()


def test_a_wrong_host_key_is_refused_without_retrying(
        late_server: tuple[int, paramiko.Ed25519Key, str, float]) -> None:
    port, _, pem, delay = late_server
    _, other_host_key = new_key()
    time.sleep(delay + 0.3)  # the server is up: only the key is wrong
    started = time.monotonic()
    with pytest.raises(HostKeyMismatchError):
        ssh.connect(address(port, other_host_key), pem, timeout=5, wait=15,
                    retry_interval=0.2)
    assert time.monotonic() - started < 3

