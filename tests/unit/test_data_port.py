"""The agent's data port (node/data_port.py, remote/data_port.py) against a real agent process:
mutual TLS from the stack's PKI before the token, the same frame limits after it."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.collections import pki
from skyward_iac.node import protocol
from skyward_iac.node.etcd_server import write_certificates
from skyward_iac.remote import data_port
from skyward_iac.remote.agent_client import AgentClient
from tests.agent_process import TOKEN, Agent, closed_without_greeting, peak_rss_mb, running_agent

GIB = 1 << 30


@pytest.fixture(scope="module")
def bundle() -> pki.ClusterCertificates:
    return pki.generate_cluster_certificates("data-port-test", ["127.0.0.1"])


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory,
          bundle: pki.ClusterCertificates) -> Iterator[tuple[Agent, int]]:
    workdir = tmp_path_factory.mktemp("data-port")
    tls = workdir / "tls"
    write_certificates(tls, bundle.server)  # as the bootstrap lays them out
    port_file = workdir / "run" / "data.port"
    with running_agent(workdir, "--data-bind", "127.0.0.1", "--tls-dir", str(tls),
                       "--data-port-file", str(port_file)) as started:
        yield started, int(port_file.read_text())


def _ours(bundle: pki.ClusterCertificates) -> ssl.SSLContext:
    return data_port.client_context(data_port.IssuedCertificate(
        bundle.ca_pem, bundle.client_cert_pem, bundle.client_key_pem))


def test_the_stacks_client_runs_tasks_over_the_data_port(
        agent: tuple[Agent, int], bundle: pki.ClusterCertificates) -> None:
    _, port = agent
    sock = data_port.connect("127.0.0.1", port, _ours(bundle))
    assert sock.version() == "TLSv1.3"
    client = AgentClient(sock, TOKEN, node=0)
    try:
        assert client.submit("pow", protocol.dumps((pow, (3, 4), {})), timeout=60).result(60) == 81
    finally:
        client.close()


def _refused_on_first_read(sock: ssl.SSLSocket) -> bool:
    """With TLS 1.3 the server checks our certificate after our side of the handshake is done:
    a refusal shows on the first read, as an alert or the connection closed."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return True


def test_a_peer_without_a_client_certificate_is_refused(
        agent: tuple[Agent, int], bundle: pki.ClusterCertificates) -> None:
    _, port = agent
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=bundle.ca_pem)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            sock = context.wrap_socket(raw, server_hostname=pki.SERVER_NAME)
        except (ssl.SSLError, ConnectionResetError):
            return  # refused during the handshake
        try:
            protocol.Channel(sock).send_raw(TOKEN.encode())
        except (ssl.SSLError, OSError):
            return
        assert _refused_on_first_read(sock), "a peer without a certificate got an answer"


def test_a_certificate_of_another_stack_is_refused(agent: tuple[Agent, int],
                                                  tmp_path: Path) -> None:
    _, port = agent
    other = pki.generate_cluster_certificates("another-stack", ["127.0.0.1"])
    # The client pins the server: another stack's CA does not vouch for this agent.
    mixed = data_port.client_context(data_port.IssuedCertificate(
        other.ca_pem, other.client_cert_pem, other.client_key_pem))
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        data_port.connect("127.0.0.1", port, mixed)
    # A peer that does not check the server still cannot pass with another stack's pair.
    careless = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    careless.check_hostname = False
    careless.verify_mode = ssl.CERT_NONE
    (tmp_path / "c.crt").write_text(other.client_cert_pem)
    (tmp_path / "c.key").write_text(other.client_key_pem)
    careless.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            sock = careless.wrap_socket(raw)
        except (ssl.SSLError, ConnectionResetError):
            return  # refused during the handshake
        try:
            protocol.Channel(sock).send_raw(TOKEN.encode())  # it even holds the token
        except (ssl.SSLError, OSError):
            return
        assert _refused_on_first_read(sock), "another stack's certificate got an answer"


def test_a_frame_over_the_limit_is_refused_before_allocation_on_the_data_port(
        agent: tuple[Agent, int], bundle: pki.ClusterCertificates) -> None:
    started, port = agent
    before = peak_rss_mb(started.pid)
    with data_port.connect("127.0.0.1", port, _ours(bundle)) as sock:
        try:
            sock.sendall(protocol.HEADER.pack(GIB, protocol.RAW) + b"x" * 65536)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        assert closed_without_greeting(sock), "the agent kept the connection open"
    assert peak_rss_mb(started.pid) - before < 50


def test_the_path_chosen_says_why() -> None:
    assert data_port.choose_path(None, None)[0] == data_port.SSH_TUNNEL
    path, why = data_port.choose_path(4000, ConnectionRefusedError("refused"))
    assert path == data_port.SSH_TUNNEL and "4000" in why and "refused" in why
    assert data_port.choose_path(4000, None) == (data_port.DATA_PORT, "mutual TLS on port 4000")
