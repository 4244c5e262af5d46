"""Large arguments shared by many tasks (issue 32): sent once per agent connection, kept by the
agent (node/buffer_cache.py), mapped by its workers from a sealed memfd (node/buffer_maps.py);
the client decides what is kept (remote/shared_buffers.py). Against real agent processes."""

from __future__ import annotations

import operator
import os
import socket
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from skyward_iac.api.function import function
from skyward_iac.node import protocol
from skyward_iac.node.messages import Result, Task, Welcome
from skyward_iac.node.shared_refs import Keep, Mapped, Use
from skyward_iac.remote import shared_buffers
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.calls import pack_call
from tests.agent_process import TOKEN, Agent, children, running_agent, wait_until

MIB = 1 << 20


class _Counted:
    """A client's socket that counts the bytes sent through it (no file descriptor: the
    client reads it with a thread of its own)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sent = 0

    def sendall(self, data: Any, /) -> None:
        self.sent += memoryview(data).nbytes
        self.sock.sendall(data)

    def recv(self, size: int, /) -> bytes:
        return self.sock.recv(size)

    def recv_into(self, buffer: Any, size: int = 0, /) -> int:
        return self.sock.recv_into(buffer, size)

    def close(self) -> None:
        protocol.Channel(self.sock).close()  # shut down first: the reader blocked on it wakes


def _array(megabytes: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).integers(0, 255, megabytes * MIB, dtype=np.uint8)


def _submit(client: AgentClient, fn: Any, *args: Any, copy: bool = False) -> Any:
    packed = pack_call(function(fn)(*args), copy=copy)
    return client.submit(getattr(fn, "__name__", "fn"), packed.payload, 60, packed.buffers)


def _sent_by_calls(agent: Agent, array: np.ndarray[Any, Any], calls: int) -> int:
    """Bytes a new client sends for ``calls`` calls of ``crc32(array)`` (each result checked)."""
    stream = _Counted(agent.connect())
    client = AgentClient(stream, TOKEN, node=0)
    try:
        for _ in range(calls):
            assert _submit(client, zlib.crc32, array).result(60) == zlib.crc32(array)
    finally:
        client.close()
    return stream.sent


def _task(task_id: int, buffers: tuple[Any, ...], megabytes: int = 2,
          fn: Any = zlib.crc32) -> Task:
    """A task calling ``fn`` on one out-of-band argument of ``megabytes``, given as
    ``buffers[0]`` (its bytes, a ``Keep`` or a ``Use``)."""
    payload, oob = protocol.dumps_with_buffers((fn, (_array(megabytes),), {}))
    assert len(oob) == 1
    return Task(task_id, "crc32", payload, 60, buffers)


def _raw(agent: Agent) -> tuple[socket.socket, protocol.Channel, Welcome]:
    sock = agent.connect()
    channel = protocol.Channel(sock)
    channel.send_raw(TOKEN.encode())
    (welcome,) = channel.receive()
    assert isinstance(welcome, Welcome)
    return sock, channel, welcome


def _results(channel: protocol.Channel, count: int) -> dict[int, Result]:
    results: dict[int, Result] = {}
    while len(results) < count:
        for message in channel.receive():
            if isinstance(message, Result):
                results[message.task_id] = message
    return results


def _value(result: Result) -> Any:
    assert result.failure is None, result.failure
    return protocol.loads(result.value or b"", result.buffers)


def _kept_memfds(pid: int) -> int:
    """The agent's memfds of large arguments (each counted once, however many descriptors
    it holds of it: the one it arrived in is also mapped)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if "memfd:skyward-" in os.readlink(fd):
                inodes.add(fd.stat().st_ino)
        except FileNotFoundError:
            pass
    return len(inodes)


def _workers_mapping_kept(agent: int) -> int:
    """How many of the agent's workers still map a large argument's memfd."""
    return sum("memfd:skyward-" in Path(f"/proc/{pid}/maps").read_text()
               for pid in children(agent))


@pytest.fixture()
def agent(tmp_path: Path) -> Iterator[Agent]:
    with running_agent(tmp_path) as started:
        yield started


def test_a_buffer_kept_once_serves_many_tasks(agent: Agent) -> None:
    array = _array(8)
    expected = zlib.crc32(array)
    stream = _Counted(agent.connect())
    client = AgentClient(stream, TOKEN, node=0)
    try:
        futures = [_submit(client, zlib.crc32, array) for _ in range(8)]
        assert [f.result(60) for f in futures] == [expected] * 8
        later = _submit(client, zlib.crc32, array, copy=True)  # a snapshot: the same bytes
        assert later.result(60) == expected
    finally:
        client.close()
    # The 8 MiB crossed twice (the first call on an array is sent undigested, the second with
    # Keep); seven more tasks sent only references.
    assert 2 * array.nbytes <= stream.sent < 3 * array.nbytes


def test_a_task_that_writes_its_argument_changes_no_other_task(agent: Agent) -> None:
    array = _array(4)
    expected = zlib.crc32(array)
    client = AgentClient(agent.connect(), TOKEN, node=0)
    try:
        assert _submit(client, zlib.crc32, array).result(60) == expected  # sent
        assert _submit(client, zlib.crc32, array).result(60) == expected  # sent and kept
        # Mapped from the memfd: the write lands in this task's private pages only.
        assert _submit(client, operator.setitem, array, slice(None), 7).result(60) is None
        assert _submit(client, zlib.crc32, array).result(60) == expected
        assert _submit(client, np.sum, array).result(60) == array.sum()
    finally:
        client.close()


def test_the_clients_budget_evicts_the_least_recently_used(agent: Agent,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shared_buffers.BUDGET_ENV, str(5 * MIB))
    first, second = _array(3, seed=1), _array(3, seed=2)
    stream = _Counted(agent.connect())
    client = AgentClient(stream, TOKEN, node=0)
    try:
        for _ in range(2):  # the second call on each array has it kept
            assert _submit(client, zlib.crc32, first).result(60) == zlib.crc32(first)
        for _ in range(2):
            assert _submit(client, zlib.crc32, second).result(60) == zlib.crc32(second)
        sent = stream.sent
        assert _submit(client, zlib.crc32, second).result(60) == zlib.crc32(second)
        assert stream.sent - sent < MIB  # second is kept
        assert _submit(client, zlib.crc32, first).result(60) == zlib.crc32(first)
        assert stream.sent - sent >= first.nbytes  # first was forgotten: sent again, whole
        assert _submit(client, zlib.crc32, first).result(60) == zlib.crc32(first)
    finally:
        client.close()


def test_the_agent_forgets_what_a_keep_evicts(agent: Agent) -> None:
    first, second = os.urandom(16), os.urandom(16)
    sock, channel, _ = _raw(agent)
    with sock:
        data = _array(2)
        channel.send_many([
            _task(1, (Keep(first, data),)),
            _task(2, (Keep(second, data, evict=(first,)),)),
            _task(3, (Use(second, data.nbytes),)),
            _task(4, (Use(first, data.nbytes),)),
        ])
        results = _results(channel, 4)
    assert [_value(results[i]) for i in (1, 2, 3)] == [zlib.crc32(data)] * 3
    failure = results[4].failure
    assert failure is not None and failure.type_name.endswith("SharedArgumentError")
    assert "not held by this node" in failure.message


def test_an_unknown_digest_fails_only_its_task(agent: Agent) -> None:
    sock, channel, _ = _raw(agent)
    with sock:
        channel.send_many([_task(1, (Use(os.urandom(16), 2 * MIB),)),
                           _task(2, (Use(b"short", 2 * MIB),)),
                           _task(3, (Mapped(1, 2 * MIB),)),  # the agent's form, not a client's
                           _task(4, (_array(2),))])
        results = _results(channel, 4)
        failures = [results[i].failure for i in (1, 2, 3)]
        assert all(f is not None and "SharedArgumentError" in f.type_name for f in failures)
        assert _value(results[4]) == zlib.crc32(_array(2))
        channel.send(_task(5, (_array(2),)))  # the connection goes on
        assert _value(_results(channel, 1)[5]) == zlib.crc32(_array(2))


def test_the_agents_cap_bounds_what_any_client_asks(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_SHARED_CAP", str(3 * MIB))
    with running_agent(tmp_path) as agent:
        sock, channel, welcome = _raw(agent)
        assert welcome.shared_cap == 3 * MIB
        big, digest = _array(4), os.urandom(16)
        with sock:
            channel.send_many([_task(1, (Keep(digest, big),), megabytes=4),
                               _task(2, (Use(digest, big.nbytes),), megabytes=4)])
            results = _results(channel, 2)
        assert _value(results[1]) == zlib.crc32(big)  # run, not kept
        failure = results[2].failure
        assert failure is not None and "at most 3145728 bytes" in failure.message
        # A client never asks for more than the cap it was told: big is sent whole each time.
        assert _sent_by_calls(agent, big, 3) >= 3 * big.nbytes


def test_a_connections_buffers_are_freed_when_it_closes(agent: Agent) -> None:
    array = _array(4)
    client = AgentClient(agent.connect(), TOKEN, node=0)
    try:
        for _ in range(3):
            assert _submit(client, zlib.crc32, array).result(60) == zlib.crc32(array)
        assert _kept_memfds(agent.pid) == 1  # the one it arrived in, kept
        assert _workers_mapping_kept(agent.pid) == 1  # kept for a next task, for a while
    finally:
        client.close()
    assert wait_until(lambda: _kept_memfds(agent.pid) == 0, 20), "the memfd outlived its client"
    assert wait_until(lambda: _workers_mapping_kept(agent.pid) == 0, 20), "a worker kept it"


def test_sharing_off_sends_every_task_its_bytes(agent: Agent,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shared_buffers.ENABLED_ENV, "0")
    array = _array(2)
    assert _sent_by_calls(agent, array, 3) >= 3 * array.nbytes


@pytest.mark.parametrize("executor", [
    ("--executor", "process", "--concurrency", "2"),  # two worker processes
    ("--executor", "process", "--fresh-processes"),  # a new process for every task
    ("--executor", "thread", "--concurrency", "3"),  # tasks at once in one process
], ids=["processes", "fresh-processes", "threads"])
def test_every_executor_maps_the_kept_buffer(tmp_path: Path, executor: tuple[str, ...]) -> None:
    array = _array(4)
    with running_agent(tmp_path, *executor) as agent:
        client = AgentClient(agent.connect(), TOKEN, node=0)
        try:
            # Kept at the second, mapped from the third; one writes it, the next read it whole.
            futures = [_submit(client, zlib.crc32, array) for _ in range(3)]
            futures += [_submit(client, operator.setitem, array, slice(None), 1)]
            futures += [_submit(client, zlib.crc32, array) for _ in range(2)]
            expected = zlib.crc32(array)
            assert [f.result(60) for f in futures] == [expected] * 3 + [None] + [expected] * 2
        finally:
            client.close()


def test_a_budget_that_is_not_a_number_is_refused_before_anything_is_provisioned(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``SKYWARD_SHARED_BUDGET`` is read when a node connects; a bad one is a ConfigError from
    ``sky.Compute`` itself, not an error on the first large argument."""
    import skyward_iac as sky
    from skyward_iac.orchestration.plan import plan_pool

    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    monkeypatch.setenv(shared_buffers.BUDGET_ENV, "1GiB")
    with pytest.raises(sky.ConfigError, match="SKYWARD_SHARED_BUDGET='1GiB'"):
        plan_pool((), None, None, {"provider": sky.Local(), "nodes": 1})
    # Nothing was provisioned: no stack in the state backend.
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and ".pulumi/stacks" in str(p)]
    monkeypatch.setenv(shared_buffers.BUDGET_ENV, f" {5 * MIB} ")
    assert shared_buffers.client_budget() == 5 * MIB
    monkeypatch.setenv(shared_buffers.BUDGET_ENV, "")
    assert shared_buffers.client_budget() == shared_buffers.DEFAULT_BUDGET
