"""The agent's cut-through relay (node/relay.py): a large argument's bytes reach the worker
while the client is still sending them (or, once all there, its sealed memfd does), and a client
that leaves mid-argument never gets a truncated task run."""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from skyward_iac.node import protocol, relay
from skyward_iac.node.buffer_maps import Lease, MapsReceiver, MapsSender
from skyward_iac.node.messages import Task
from skyward_iac.node.shared_refs import Mapped
from skyward_iac.remote.agent_client import AgentClient
from tests.agent_process import TOKEN, Agent, running_agent, wait_until

MIB = 1 << 20


def _frame_bytes(task: Task) -> bytes:
    return b"".join(bytes(piece) for piece in protocol.encode(task))


def _array(data: bytes) -> np.ndarray[Any, Any]:
    """Bytes as a numpy array: pickled out of band (a bytearray would travel in the pickle)."""
    return np.frombuffer(data, dtype=np.uint8).copy()


def _task(data: bytes, fn: Any = zlib.crc32, args: tuple[Any, ...] | None = None,
          task_id: int = 1) -> Task:
    payload, buffers = protocol.dumps_with_buffers((fn, args or (_array(data),), {}))
    assert buffers, "the argument must travel out of band for this test"
    return Task(task_id, fn.__name__, payload, None, buffers)


def _drain(sock: socket.socket) -> None:
    while sock.recv(1 << 20):
        pass


class _Relay:
    """``relay.serve`` between a client socket pair and a worker socket pair, in a thread."""

    def __init__(self) -> None:
        self.client, agent_in = socket.socketpair()
        agent_out, self.worker = socket.socketpair()
        self.outbound = protocol.Channel(agent_out)
        self.raised: list[BaseException] = []
        self.send_failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._serve, args=(agent_in,), daemon=True)
        self.thread.start()

    def _dispatch(self, messages: Sequence[Any]) -> None:
        try:
            self.outbound.send_many(messages)
        except OSError as exc:
            self.send_failures.append(exc)

    def _serve(self, agent_in: socket.socket) -> None:
        try:
            relay.serve(protocol.Channel(agent_in), self._dispatch)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.raised.append(exc)


def test_the_argument_is_forwarded_before_it_has_all_arrived() -> None:
    data = os.urandom(8 * MIB)
    frame = _frame_bytes(_task(data))
    pair = _Relay()
    held_back = MIB
    pair.client.sendall(frame[:-held_back])
    # Store-and-forward would send the worker nothing until the last byte came.
    def forwarded() -> bool:
        pair.worker.settimeout(0.1)
        try:
            return len(pair.worker.recv(1 << 16, socket.MSG_PEEK)) >= 1 << 15
        except TimeoutError:
            return False
    assert wait_until(forwarded, 20), "nothing reached the worker before the argument was whole"
    pair.worker.settimeout(None)
    pair.client.sendall(frame[-held_back:])
    (task,) = protocol.Channel(pair.worker).receive()
    assert bytes(task.buffers[0]) == data
    pair.client.close()
    pair.thread.join(10)
    assert isinstance(pair.raised[0], protocol.ConnectionClosed)
    assert not pair.send_failures


def test_a_client_leaving_mid_argument_fails_the_forwarding_send() -> None:
    frame = _frame_bytes(_task(os.urandom(4 * MIB)))
    pair = _Relay()
    # A worker reading what it is sent, as a real one does.
    threading.Thread(target=_drain, args=(pair.worker,), daemon=True).start()
    pair.client.sendall(frame[:-MIB])
    pair.client.close()
    pair.thread.join(20)
    assert isinstance(pair.raised[0], protocol.ConnectionClosed)
    assert isinstance(pair.send_failures[0], relay.SourceLost)


def test_small_or_many_buffers_are_read_whole_first() -> None:
    assert relay.relayed([relay.CUT_THROUGH_MIN])
    assert not relay.relayed([])
    assert not relay.relayed([relay.CUT_THROUGH_MIN - 1])
    assert not relay.relayed([relay.CUT_THROUGH_MIN, 0])
    assert not relay.relayed([MIB] * (relay.MAX_RELAYED_BUFFERS + 1))


@pytest.fixture()
def agent(tmp_path: Path) -> Iterator[Agent]:
    with running_agent(tmp_path) as started:
        yield started


def test_a_real_agent_relays_a_large_argument_intact(agent: Agent) -> None:
    data = os.urandom(16 * MIB)
    client = AgentClient(agent.connect(), TOKEN, node=0)
    try:
        payload, buffers = protocol.dumps_with_buffers((zlib.crc32, (_array(data),), {}))
        future = client.submit("crc32", payload, timeout=60, buffers=buffers)
        assert future.result(60) == zlib.crc32(data)
    finally:
        client.close()


def test_a_task_whose_client_left_mid_argument_never_runs(agent: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    task = _task(b"", fn=Path.write_bytes, args=(marker, _array(os.urandom(8 * MIB))))
    with agent.connect() as sock:
        channel = protocol.Channel(sock)
        channel.send_raw(TOKEN.encode())
        assert type(channel.receive()[0]).__name__ == "Welcome"
        frame = _frame_bytes(task)
        sock.sendall(frame[:-MIB])
        time.sleep(0.5)  # the agent is forwarding what came
    time.sleep(1.0)
    assert not marker.exists(), "a task with half its argument ran"
    client = AgentClient(agent.connect(), TOKEN, node=0)  # and the node still serves
    try:
        assert client.submit("pow", protocol.dumps((pow, (2, 5), {})), timeout=60).result(60) == 32
    finally:
        client.close()
    log = (agent.workdir / "agent.log").read_text()
    assert "left mid-argument" in log


def _arrived(data: bytes) -> relay.Arriving:
    """``data`` received into an ``Arriving`` from a socket, in odd-sized pieces."""
    ours, theirs = socket.socketpair()
    arriving = relay.Arriving(len(data))

    def send() -> None:
        with ours:
            for start in range(0, len(data), 100_003):
                ours.sendall(data[start:start + 100_003])

    sender = threading.Thread(target=send)
    sender.start()
    with theirs:
        arriving.fill_from(theirs)
    sender.join()
    return arriving


def test_an_argument_arrives_into_a_memfd_sealed_once_whole() -> None:
    data = os.urandom(3 * MIB + 5)
    arriving = _arrived(data)
    fd = arriving.memfd()
    assert os.pread(fd, len(data) + 1, 0) == data == bytes(arriving)
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    assert seals & relay.ARRIVED_SEALS == relay.ARRIVED_SEALS
    with pytest.raises(PermissionError):
        os.pwrite(fd, b"x", 0)
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 1)
    with pytest.raises(PermissionError):  # nobody maps it writable and shared any more
        mmap.mmap(fd, len(data), flags=mmap.MAP_SHARED)
    private = mmap.mmap(fd, len(data), flags=mmap.MAP_PRIVATE)  # as a worker maps it
    private[:1] = bytes([data[0] ^ 1])  # a task's write stays its own
    assert os.pread(fd, 1, 0) == data[:1]
    private.close()


def test_an_argument_that_never_arrives_whole_is_never_mapped() -> None:
    ours, theirs = socket.socketpair()
    arriving = relay.Arriving(2 * MIB)
    ours.sendall(os.urandom(1000))  # fits the socket's buffer: sent before it is read
    ours.close()
    with theirs, pytest.raises(protocol.ConnectionClosed):
        arriving.fill_from(theirs)
    arriving.abandon()
    with pytest.raises(relay.SourceLost):
        arriving.memfd()


def test_a_worker_is_sent_the_memfd_of_an_arrived_argument_not_its_bytes() -> None:
    data = os.urandom(2 * MIB)
    sender = MapsSender()
    receiver = MapsReceiver(os.dup(sender.worker_fd()))
    sender.started()
    try:
        task = Task(1, "f", b"", None, (b"small", _arrived(data)))
        (sent,) = sender.for_worker([task])
        assert sent.buffers == (b"small", Mapped(1, len(data), reuse=False))
        resolved = receiver.resolve(sent)
        with Lease(resolved.buffers) as (small, mapped):
            assert small == b"small" and bytes(mapped) == data
        assert not receiver._idle  # no later task maps it: not kept mapped
    finally:
        receiver.close()
        sender.close()


def test_a_real_agents_worker_maps_the_argument_it_arrived_in(agent: Agent) -> None:
    data = os.urandom(4 * MIB)

    def crc_and_where(array: Any) -> tuple[int, bool]:  # pickled by value: runs on the worker
        with open("/proc/self/maps") as maps:
            return zlib.crc32(array), "memfd:skyward-arg" in maps.read()

    client = AgentClient(agent.connect(), TOKEN, node=0)
    try:
        payload, buffers = protocol.dumps_with_buffers((crc_and_where, (_array(data),), {}))
        future = client.submit("crc", payload, timeout=60, buffers=buffers)
        assert future.result(60) == (zlib.crc32(data), True)
    finally:
        client.close()


def test_a_small_argument_arrives_in_anonymous_memory_and_travels_as_bytes() -> None:
    data = os.urandom(relay.MAPPED_MIN // 2)
    arriving = _arrived(data)  # no descriptor for it: a frame of many would hold too many
    assert arriving.fd is None and bytes(arriving) == data
    with pytest.raises(ValueError):
        arriving.memfd()
    task = Task(1, "f", b"", None, (arriving,))
    sender = MapsSender()
    try:
        assert sender.for_worker([task]) == [task]
    finally:
        sender.close()
