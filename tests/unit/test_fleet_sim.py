"""The fleet simulator of figure 7 (bench/fleet_sim.py) speaks the real handshake: the client's
own SSH connection (pinned host key, public-key login), agent tunnel and ``AgentClient`` reach
each simulated node and run tasks there; it refuses what a real node refuses (another host key,
a wrong token, a tunnel to another port); and figure 7's pool, assembled from the client's
parts, connects, beats, broadcasts and maps against it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import paramiko
import pytest

import skyward_iac as sky
from skyward_iac.api.errors import HostKeyMismatchError, NodeConnectionError
from skyward_iac.node import protocol
from skyward_iac.node.messages import Task
from skyward_iac.outputs import NodeAddress
from skyward_iac.remote import ssh
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.calls import pack_call

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import fleet
import fleet_report
import fleet_sim

TIMEOUT = 30.0


@sky.function
def add(a: int, b: int) -> int:
    return a + b


@sky.function
def refuse(reason: str) -> None:
    raise ValueError(reason)


@pytest.fixture(scope="module")
def simulator() -> Iterator[fleet.Simulator]:
    with fleet.Simulator(3) as started:
        yield started


def connected(simulator: fleet.Simulator, index: int) -> tuple[object, AgentClient]:
    """The client's SSH connection to simulated node ``index`` and its agent client."""
    outputs, ports = fleet.outputs_of(simulator.fleet)
    connection = ssh.connect(outputs.node(index), outputs.ssh_private_key, TIMEOUT)
    channel = ssh.open_tunnel(connection, ports[index], TIMEOUT)
    return connection, AgentClient(channel, outputs.agent_token, index)


def test_a_real_agent_client_runs_tasks_on_each_simulated_node(
        simulator: fleet.Simulator) -> None:
    for index in range(3):
        connection, client = connected(simulator, index)
        try:
            assert client.welcome.node == index
            assert client.welcome.protocol == protocol.PROTOCOL_VERSION
            client.configure({"node": index})
            packed = pack_call(add(40, index))
            assert client.submit("add", packed.payload, TIMEOUT).result(TIMEOUT) == 40 + index
        finally:
            client.close()
            connection.close()


def test_a_task_failure_comes_back_as_its_exception(simulator: fleet.Simulator) -> None:
    connection, client = connected(simulator, 1)
    try:
        packed = pack_call(refuse("no"))
        with pytest.raises(ValueError, match="no") as raised:
            client.submit("refuse", packed.payload, TIMEOUT).result(TIMEOUT)
        assert "Remote traceback (node 1)" in "".join(raised.value.__notes__)
    finally:
        client.close()
        connection.close()


def test_another_host_key_is_refused(simulator: fleet.Simulator) -> None:
    outputs, _ = fleet.outputs_of(simulator.fleet)
    node, other = outputs.node(0), outputs.node(1)
    impostor = NodeAddress(node.index, node.private_address, node.public_address,
                           node.ssh_port, node.ssh_user, other.host_key, node.workdir)
    with pytest.raises(HostKeyMismatchError):
        ssh.connect(impostor, outputs.ssh_private_key, TIMEOUT)


def test_a_wrong_token_gets_no_welcome(simulator: fleet.Simulator) -> None:
    outputs, ports = fleet.outputs_of(simulator.fleet)
    connection = ssh.connect(outputs.node(2), outputs.ssh_private_key, TIMEOUT)
    try:
        channel = ssh.open_tunnel(connection, ports[2], TIMEOUT)
        with pytest.raises((EOFError, OSError, NodeConnectionError)):
            AgentClient(channel, "not-the-token", 2)
        with pytest.raises(paramiko.ChannelException):
            ssh.open_tunnel(connection, ports[2] + 1, TIMEOUT)  # nothing else is reachable
    finally:
        connection.close()


def test_frames_are_whole_only_with_their_out_of_band_buffers() -> None:
    array = np.arange(20_000, dtype=np.float64)  # 160 kB: travels out of band
    task = Task(7, "sum", b"payload", 5.0, (array.data,))
    wire = b"".join(bytes(piece) for piece in protocol.encode(task))
    frames = fleet_sim.FrameBuffer()
    frames.data += wire[:-1]
    assert frames.whole_frame() is None
    frames.data += wire[-1:] + protocol.HEADER.pack(1, protocol.RAW)  # the next frame begins
    length = frames.whole_frame()
    assert length == len(wire)
    received = protocol.read_message(frames.take(length))
    assert (received.task_id, received.payload) == (7, b"payload")
    assert np.array_equal(np.frombuffer(received.buffers[0], dtype=np.float64), array)
    assert frames.whole_frame() is None  # the next frame's header only


def test_figure_7s_pool_connects_beats_broadcasts_and_maps(simulator: fleet.Simulator) -> None:
    pool_of = fleet.FleetPool(simulator.fleet)
    try:
        pool = pool_of.connect(TIMEOUT * 2)
        assert add(1, 2) @ pool == [3, 3, 3]
        assert pool.map(fleet.noop, range(300)) == list(range(300))
        # Each node's first heartbeat was written over SFTP at its first contact.
        beats = [simulator.root / f"node-{i}" / "heartbeat" for i in range(3)]
        assert [beat.read_text().split()[0] for beat in beats] == ["beat"] * 3
    finally:
        pool_of.close()


def test_figure_7_measures_and_reports_a_size() -> None:
    figures = fleet.one(2, tasks=200, idle=0.2)
    assert figures["threads per node"] > 0 and figures["connect s"] > 0
    assert figures["tasks per frame"] >= 1
    printed = fleet_report.report({2: figures})
    assert printed.startswith("| nodes | connect s |")
    assert "At 2 nodes, once every node is in service, the client holds threads:" in printed
    assert "At 2 nodes, after the map, the client holds threads:" in printed
    assert 0 < figures["threads steady"] <= figures["threads at ready"] + 4


def raw_figures(nodes: int, seconds: float, map_seconds: float) -> dict[str, object]:
    """One size's raw figures as ``fleet.one`` returns them (only what the report reads)."""
    phases = {f"{phase} {what}": seconds for phase in ("connect", "broadcasts", "map", "idle")
              for what in ("client CPU s", "sim CPU s")}
    return {**phases, "connect s": seconds, "broadcast ms": seconds * 1000, "broadcasts": 5,
            "map s": map_seconds, "map tasks/s": 1000 / map_seconds, "idle s": 5.0,
            "threads at ready": 3 * nodes, "threads steady": 20, "rss at ready": float(nodes),
            "fds at ready": nodes,
            "close s": seconds, "threads per node": 3.0, "rss per node": 1.0,
            "fds per node": 1.0, "peak rss": float(nodes), "load average": 1.0,
            "census": {"threads": {"paramiko.Transport": nodes}, "fds": {"socket": nodes}},
            "connect timeline": [[seconds / 2, nodes // 2], [seconds, nodes]]}


def test_the_report_divides_each_figure_by_linear_growth() -> None:
    # 10 -> 40 nodes: connect grows 4x (linear: 1.00x), the map takes twice as long (flat: 2x).
    printed = fleet_report.table({10: raw_figures(10, 1.0, 3.0), 40: raw_figures(40, 4.0, 6.0)})
    header, _, small, large = printed.splitlines()
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    cells = dict(zip(columns, (cell.strip() for cell in large.strip("|").split("|")),
                     strict=True))
    assert cells["connect s"] == "4 (1.00×)"
    assert cells["map 100k s"] == "6 (2.00×)"
    assert cells["client threads"] == "120 (1.00×)"
    assert "×" not in small  # the smallest size is the reference


def test_the_report_says_which_size_did_not_connect_in_time() -> None:
    stuck = {"connect timeline": [[300.0, 520], [900.0, 733]],
             "connect failed": {"ready": 733, "after s": 900.0, "why": "only 733 ready"}}
    printed = fleet_report.report({10: raw_figures(10, 1.0, 3.0), 1000: stuck})
    assert "| 1000 |" not in printed  # no row of figures it does not have
    assert "- 1000 nodes: half of them in service in 300 s; 733 of 1000 after 900 s" in printed
    assert "- 10 nodes: the first half in service in 0.5 s, the second half in 0.5 s" in printed


def test_each_simulated_node_serves_a_data_port_that_demands_the_stacks_certificate(
        simulator: fleet.Simulator) -> None:
    import ssl

    from skyward_iac.remote import data_port

    outputs, _ = fleet.outputs_of(simulator.fleet)
    certificate = data_port.certificate_of(outputs)
    assert certificate is not None
    for index in range(3):
        connection = ssh.connect(outputs.node(index), outputs.ssh_private_key, TIMEOUT)
        try:  # the port as a client reads it: the command a node answers over SSH
            port = data_port.announced_port(connection, outputs.node(index).workdir, TIMEOUT)
        finally:
            connection.close()
        assert port is not None
        stream = data_port.connect("127.0.0.1", port, data_port.client_context(certificate))
        assert stream.version() == "TLSv1.3"
        client = AgentClient(stream, outputs.agent_token, index)
        try:
            packed = pack_call(add(2, index))
            assert client.submit("add", packed.payload, TIMEOUT).result(TIMEOUT) == 2 + index
        finally:
            client.close()
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the node, shows no certificate
    anonymous.load_verify_locations(cadata=certificate.ca_pem)
    try:
        refused = data_port.connect("127.0.0.1", port, anonymous)
        refused.settimeout(TIMEOUT)
        refused.sendall(b"".join(bytes(p) for p in protocol.encode_raw(outputs.agent_token.encode())))
        answer = refused.recv(1)  # TLS 1.3: the refusal arrives with the first read
    except (ssl.SSLError, ConnectionError):
        answer = b""
    assert answer == b"", "a peer without the stack's certificate was answered"
