"""A real Local pool's agents are reached over their local socket (a Unix socket in each node's
workdir, node/local_socket.py): small and 100 MB numpy arguments round-trip over it, a 100 MB
one as a sealed memfd (node/fd_buffers.py), the log says which path each node took and why,
SSH is held only where the collections tunnel needs it, and with ``SKYWARD_LOCAL_SOCKET=0`` (or
a socket that does not answer) the client takes the TLS data port instead."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.node import protocol
from skyward_iac.remote import data_port, fd_channel
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.bootstrap import LOCAL_SOCKET_FILE
from tests.agent_process import connections_to

pytestmark = pytest.mark.integration


@sky.function
def checksum(array: object) -> tuple[int, float]:
    import numpy as np

    values = np.asarray(array)
    return int(values.size), float(values[::4096].sum())


@sky.function
def in_handed_memfd(array: object) -> tuple[float, bool]:
    """A sample sum of ``array``, and whether its memory is a memfd the client handed over
    (node/fd_buffers.py) rather than one the agent filled from the socket."""
    import numpy as np

    values = np.asarray(array)
    at = values.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        spans = [line.split()[0].split("-") for line in maps if "skyward-handed" in line]
    return float(values[::4096].sum()), any(int(lo, 16) <= at < int(hi, 16) for lo, hi in spans)


@sky.function
def add(x: int, y: int) -> int:
    return x + y


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def started() -> Iterator[tuple[sky.Pool, list[str]]]:
    lines = _Lines()
    logger = logging.getLogger("skyward")
    logger.addHandler(lines)
    before = logger.level
    logger.setLevel(logging.INFO)
    try:
        with sky.Compute(provider=sky.Local(), nodes=2,
                         image=sky.Image(pip=("--offline", "numpy==2.4.6")),
                         options=sky.Options(console=False, default_compute_timeout=120)) as pool:
            yield pool, lines.lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(before)


def test_every_node_is_reached_over_its_local_socket(
        started: tuple[sky.Pool, list[str]]) -> None:
    pool, lines = started
    for node in pool.nodes:
        assert node.path == data_port.LOCAL_SOCKET
        stream = node.agent._channel.stream
        assert isinstance(stream, socket.socket) and stream.family == socket.AF_UNIX
        assert not isinstance(stream, ssl.SSLSocket)
        said = [line for line in lines if line.startswith(f"node {node.index}: agent reached")]
        assert said and "over the local socket" in said[-1] and LOCAL_SOCKET_FILE in said[-1]
    head, worker = pool.nodes
    # SSH is not needed to carry the local socket: only the head's, for the collections tunnel.
    assert worker.connection.held is None and head.connection.held is not None
    assert connections_to(worker.address.public_address) == 0
    assert connections_to(head.address.public_address) == 1


def test_small_and_100_mb_numpy_arguments_round_trip(started: tuple[sky.Pool, list[str]]) -> None:
    import numpy as np

    pool, _ = started
    assert [add(x, 1) >> pool for x in range(5)] == [1, 2, 3, 4, 5]
    array = np.random.default_rng(7).random(100_000_000 // 8)
    assert pool.run(checksum(array)) == (array.size, float(array[::4096].sum()))
    small = np.arange(10, dtype=np.int64)
    assert pool.run(checksum(small)) == (10, 0.0)


def test_a_100_mb_argument_goes_as_a_sealed_memfd(started: tuple[sky.Pool, list[str]]) -> None:
    import numpy as np

    pool, _ = started
    assert all(isinstance(node.agent._channel, fd_channel.DescriptorChannel)
               for node in pool.nodes)
    array = np.random.default_rng(11).random(100_000_000 // 8)
    for _ in range(2):  # the second call: kept by the agent (Keep), the same memfd
        assert pool.run(in_handed_memfd(array)) == (float(array[::4096].sum()), True)
    small = np.arange(1000, dtype=np.float64)
    assert pool.run(in_handed_memfd(small)) == (0.0, False)


def test_turned_off_or_unanswered_the_data_port_serves(
        started: tuple[sky.Pool, list[str]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    pool, _ = started
    node = pool.nodes[1]
    tls = Path(node.address.workdir) / "tls"
    # etcd's server pair, which the agent presents, also carries clientAuth: a stack member.
    certificate = data_port.IssuedCertificate(*((tls / name).read_text() for name in
                                                ("ca.crt", "server.crt", "server.key")))
    local = Path(node.address.workdir) / LOCAL_SOCKET_FILE
    token = (Path(node.address.workdir) / "agent.token").read_text().strip()
    cases = [("0", local, data_port.LOCAL_SOCKET_ENV), ("1", local.with_name("gone.sock"),
                                                       "local socket failed")]
    for setting, path, why in cases:
        monkeypatch.setenv(data_port.LOCAL_SOCKET_ENV, setting)
        caplog.clear()
        with caplog.at_level("INFO", logger="skyward"):
            stream, chosen = data_port.agent_stream(node.connection, node.address,
                                                    node.agent_port, certificate, 30, path)
        assert chosen == data_port.DATA_PORT and isinstance(stream, ssl.SSLSocket)
        assert "over the data port" in caplog.text and why in caplog.text
        client = AgentClient(stream, token, node.index)
        try:
            assert client.submit("pow", protocol.dumps((pow, (2, 7), {})),
                                 timeout=60).result(60) == 128
        finally:
            client.close()
