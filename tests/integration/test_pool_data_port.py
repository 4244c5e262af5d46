"""A Local pool's agents serve a data port with mutual TLS from the stack's PKI: the client
with its local socket turned off (``SKYWARD_LOCAL_SOCKET=0``, as on a cloud) prefers it,
falls back to the SSH tunnel when it cannot use it, and the port refuses a peer
without the stack's certificate and an oversized frame before allocating it."""

from __future__ import annotations

import os
import pickle
import socket
import ssl
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.collections import pki
from skyward_iac.node import protocol
from skyward_iac.orchestration.node import Node
from skyward_iac.remote import data_port
from skyward_iac.remote.agent_client import AgentClient
from tests.agent_process import closed_without_greeting, peak_rss_mb

pytestmark = pytest.mark.integration
GIB = 1 << 30


@sky.function
def checksum(data: object) -> int:
    import zlib

    return zlib.crc32(data)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pool() -> Iterator[sky.Pool]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(data_port.LOCAL_SOCKET_ENV, "0")  # the TLS path a cloud node gets
        with sky.Compute(provider=sky.Local(), nodes=1,
                         options=sky.Options(default_compute_timeout=120)) as started:
            yield started


def _node(pool: sky.Pool) -> Node:
    return pool.nodes[0]


def _data_port(node: Node) -> int:
    port = data_port.announced_port(node.connection, node.address.workdir, 30)
    assert port is not None, "the node's agent announced no data port"
    return port


def _token(node: Node) -> bytes:
    return (Path(node.address.workdir) / "agent.token").read_bytes().strip()


def test_the_client_reaches_the_agent_over_the_data_port(pool: sky.Pool) -> None:
    stream = _node(pool).agent._channel.stream
    assert isinstance(stream, ssl.SSLSocket) and stream.version() == "TLSv1.3"
    assert _node(pool).path == data_port.DATA_PORT
    data = os.urandom(8 << 20)
    # A PickleBuffer travels out of band (the node has no numpy): relayed as it arrives.
    assert pool.run(checksum(pickle.PickleBuffer(bytearray(data)))) == zlib.crc32(data)


def test_a_peer_without_the_stacks_certificate_is_refused(pool: sky.Pool) -> None:
    node = _node(pool)
    careless = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    careless.check_hostname = False
    careless.verify_mode = ssl.CERT_NONE
    with socket.create_connection((node.address.public_address, _data_port(node)), 10) as raw:
        try:
            sock = careless.wrap_socket(raw)
            protocol.Channel(sock).send_raw(_token(node))  # even with the token
            sock.settimeout(10)
            answered = sock.recv(1) != b""
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
            answered = False
    assert not answered, "a peer without a client certificate got an answer"


def test_a_frame_over_the_limit_is_refused_before_allocation(pool: sky.Pool,
                                                             tmp_path: Path) -> None:
    node = _node(pool)
    tls = Path(node.address.workdir) / "tls"
    # etcd's server pair (which the agent presents) also carries clientAuth: a stack member.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=tls / "ca.crt")
    context.load_cert_chain(tls / "server.crt", tls / "server.key")
    agent_pid = int((Path(node.address.workdir) / "run" / "agent.pid").read_text())
    before = peak_rss_mb(agent_pid)
    with data_port.connect(node.address.public_address, _data_port(node), context) as sock:
        try:
            sock.sendall(protocol.HEADER.pack(GIB, protocol.RAW) + b"x" * 65536)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
        assert closed_without_greeting(sock), "the agent kept the connection open"
    time.sleep(0.2)
    assert peak_rss_mb(agent_pid) - before < 50


def test_a_data_port_the_client_cannot_use_falls_back_to_the_ssh_tunnel(
        pool: sky.Pool, caplog: pytest.LogCaptureFixture) -> None:
    node = _node(pool)
    # Another stack's certificate: the client cannot verify this agent, so it must not use
    # the port, and reaches the agent through SSH instead.
    other = pki.generate_cluster_certificates("another-stack", ["127.0.0.1"])
    certificate = data_port.IssuedCertificate(other.ca_pem, other.client_cert_pem,
                                              other.client_key_pem)
    with caplog.at_level("INFO", logger="skyward"):
        stream, path = data_port.agent_stream(node.connection, node.address, node.agent_port,
                                              certificate, 30)
    assert not isinstance(stream, ssl.SSLSocket) and path == data_port.SSH_TUNNEL
    assert "over the SSH tunnel" in caplog.text and "unreachable" in caplog.text
    client = AgentClient(stream, _token(node).decode(), node.index)
    try:
        assert client.submit("pow", protocol.dumps((pow, (2, 7), {})), timeout=60).result(60) == 128
    finally:
        client.close()


def test_a_pool_without_collections_reaches_its_agents_over_the_data_port_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(data_port.LOCAL_SOCKET_ENV, "0")
    options = sky.Options(cluster=False, default_compute_timeout=120)
    with sky.Compute(provider=sky.Local(), nodes=2, options=options) as bare:
        for node in bare.nodes:
            stream = node.agent._channel.stream
            assert isinstance(stream, ssl.SSLSocket) and stream.version() == "TLSv1.3"
            # No etcd tunnel to carry: every node's SSH is released once its agent answers.
            assert node.connection.held_transport is None
        assert bare.run(checksum(b"no etcd here")) == zlib.crc32(b"no etcd here")
