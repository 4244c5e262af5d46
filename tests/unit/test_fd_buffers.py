"""Large buffers handed to a Local agent as sealed memfds over its Unix socket
(node/fd_buffers.py, remote/fd_channel.py), against a real agent process: arguments of every
size arrive right, large ones without crossing the socket (the worker maps the client's own
memfd), kept ones are reused, and a hostile peer of the same user (token in hand) that sends
bad descriptors is refused without hurting the agent or leaking a descriptor."""

from __future__ import annotations

import array
import contextlib
import fcntl
import os
import pickle
import socket
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from skyward_iac.api.function import function
from skyward_iac.node import fd_buffers, local_socket, protocol
from skyward_iac.node.messages import Cancel, Task, Welcome
from skyward_iac.remote import data_port, fd_channel
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.bootstrap import LOCAL_SOCKET_FILE
from tests.agent_process import TOKEN, Agent, closed_without_greeting, running_agent, wait_until

MIB = 1 << 20


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    workdir = tmp_path_factory.mktemp("fd-buffers")
    with running_agent(workdir, "--local-socket", str(workdir / LOCAL_SOCKET_FILE)) as started:
        yield started


def _client(agent: Agent) -> AgentClient:
    return AgentClient(data_port.connect_local(agent.workdir / LOCAL_SOCKET_FILE), TOKEN, node=0)


def _submit(client: AgentClient, fn: Any, *args: Any) -> Any:
    from skyward_iac.remote.calls import pack_call
    packed = pack_call(function(fn)(*args), copy=False)
    return client.submit("probe", packed.payload, 120, packed.buffers).result(120)


def _probe(*arrays: Any) -> tuple[list[int], int]:
    """Run in the worker: each argument's crc32, and how many of them lie in a memfd a client
    handed over (``/proc/self/maps`` names the mapping each one's memory is in)."""
    import zlib as z
    with open("/proc/self/maps") as maps:
        handed = [tuple(int(end, 16) for end in line.split()[0].split("-"))
                  for line in maps if "skyward-handed" in line]
    at = [a.__array_interface__["data"][0] for a in arrays]
    return [z.crc32(a) for a in arrays], sum(any(lo <= x < hi for lo, hi in handed) for x in at)


def _log(agent: Agent) -> str:
    return (agent.workdir / "agent.log").read_text()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_the_agent_offers_descriptors_on_its_unix_socket_only(agent: Agent) -> None:
    client = _client(agent)
    try:
        assert client.welcome.descriptors
        assert isinstance(client._channel, fd_channel.DescriptorChannel)
    finally:
        client.close()
    tcp = AgentClient(agent.connect(), TOKEN, node=0)
    try:
        assert not tcp.welcome.descriptors
        assert not isinstance(tcp._channel, fd_channel.DescriptorChannel)
    finally:
        tcp.close()


@pytest.mark.parametrize("size", [1000, MIB - 1, MIB, 100_000_000])
def test_an_argument_of_any_size_arrives_right(agent: Agent, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    client = _client(agent)
    try:
        crcs, handed = _submit(client, _probe, data)
    finally:
        client.close()
    assert crcs == [zlib.crc32(data)]
    # From fd_buffers.DESCRIPTOR_MIN on, the worker maps the very memfd the client filled.
    assert handed == (1 if size >= fd_buffers.DESCRIPTOR_MIN else 0)


def test_a_client_that_sends_bytes_is_served_as_before(agent: Agent,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # As an older client would, or one with SKYWARD_LOCAL_DESCRIPTORS=0: bytes through the socket.
    monkeypatch.setenv(fd_channel.ENABLED_ENV, "0")
    data = np.random.default_rng(3).integers(0, 255, 4 * MIB, dtype=np.uint8)
    client = _client(agent)
    try:
        assert type(client._channel) is protocol.Channel
        assert _submit(client, _probe, data) == ([zlib.crc32(data)], 0)
    finally:
        client.close()


def test_several_large_arguments_in_one_call_and_kept_ones_reused(agent: Agent) -> None:
    arrays = [np.full(4 * MIB + i, i, dtype=np.uint8) for i in range(3)]
    small = np.arange(1000, dtype=np.uint8)
    client = _client(agent)
    try:
        crcs, handed = _submit(client, _probe, *arrays, small)
        assert crcs == [zlib.crc32(a) for a in (*arrays, small)] and handed == 3
        # The same array again and again: sent once more with Keep, then used from the
        # agent's cache (remote/shared_buffers.py), the memfd it came in.
        shared = np.random.default_rng(7).integers(0, 255, 8 * MIB, dtype=np.uint8)
        for _ in range(4):
            assert _submit(client, _probe, shared) == ([zlib.crc32(shared)], 1)
    finally:
        client.close()


def test_descriptors_do_not_leak_in_the_agent(agent: Agent) -> None:
    data = np.ones(2 * MIB, dtype=np.uint8)
    client = _client(agent)
    try:
        _submit(client, _probe, data)
        before = _fds(agent.pid)
        for i in range(40):
            data[0] = i  # a new array's bytes each time: nothing is kept
            assert _submit(client, _probe, data.copy())[0] == [zlib.crc32(data)]
        assert wait_until(lambda: _fds(agent.pid) <= before, 10), (before, _fds(agent.pid))
    finally:
        client.close()


# -- a hostile peer: the agent's own user, the token in hand, bad descriptors ----------------


def _task_frame() -> list[Any]:
    """A frame of one task whose 2 MiB argument goes out of band."""
    payload, oob = protocol.dumps_with_buffers((zlib.crc32, (np.ones(2 * MIB, np.uint8),), {}))
    return protocol.encode(Task(1, "crc32", payload, 60, tuple(pickle.PickleBuffer(b)
                                                                for b in oob)))


def _head(frames: list[Any], sizes: list[int]) -> bytes:
    """The frame's header and payload with a size table of ``sizes``."""
    table = protocol.COUNT.pack(len(sizes)) + b"".join(protocol.SIZE.pack(s) for s in sizes)
    return b"".join(frames[:2]) + table


def _memfd(size: int, seals: int = fd_buffers.CLIENT_SEALS) -> int:
    fd = os.memfd_create("hostile", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _pipe() -> int:
    read, write = os.pipe()
    os.close(write)
    return read


def _greeted(agent: Agent, fds: list[int] | None = None) -> socket.socket:
    """A raw connection past the token (sent with ``fds`` attached when given)."""
    sock = local_socket.connect(agent.workdir / LOCAL_SOCKET_FILE, 10)
    token = protocol.HEADER.pack(len(TOKEN), protocol.RAW) + TOKEN.encode()
    sock.sendmsg([token], _rights(fds) if fds else [])
    if not fds:
        assert isinstance(protocol.Channel(sock).receive()[0], Welcome)
    return sock


def _rights(fds: list[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True


D = fd_buffers.DESCRIPTOR
_SIZE = 2 * MIB
HOSTILE = {
    "an unsealed memfd": ([D | _SIZE], lambda: [_memfd(_SIZE, seals=0)]),
    "a memfd sealed against growing only": ([D | _SIZE],
                                            lambda: [_memfd(_SIZE, seals=fcntl.F_SEAL_GROW)]),
    "a memfd smaller than declared": ([D | _SIZE], lambda: [_memfd(_SIZE - 4096)]),
    "a lent memfd smaller than declared": ([D | fd_buffers.LENT | _SIZE],
                                           lambda: [_memfd(_SIZE - 4096)]),
    "lent without a descriptor": ([fd_buffers.LENT | _SIZE], list),
    "a pipe": ([D | _SIZE], lambda: [_pipe()]),
    "more descriptors than declared": ([D | _SIZE], lambda: [_memfd(_SIZE), _memfd(_SIZE)]),
    "descriptors none is declared for": ([_SIZE], lambda: [_memfd(_SIZE)]),
    "a declared descriptor missing": ([D | _SIZE], list),
    "past the most a read takes": ([D | _SIZE], lambda: [_memfd(_SIZE)
                                                         for _ in range(
                                                             fd_buffers.MAX_DESCRIPTORS + 1)]),
}


@contextlib.contextmanager
def _refused_and_at_rest(agent: Agent, case: str) -> Iterator[None]:
    """Around a hostile connection: the agent warmed first (a worker up, its fds at rest);
    after it, the agent logged one more refusal and holds no more fds than before."""
    warm = _client(agent)
    try:
        assert _submit(warm, _probe, np.ones(10, np.uint8))[0]
    finally:
        warm.close()
    before, refused = _fds(agent.pid), _log(agent).count("broke the protocol")
    yield
    assert wait_until(lambda: _log(agent).count("broke the protocol") > refused, 10), case
    assert wait_until(lambda: _fds(agent.pid) <= before, 10), (case, before, _fds(agent.pid))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_bad_descriptor_is_refused_and_the_agent_goes_on(agent: Agent, case: str) -> None:
    sizes, make = HOSTILE[case]
    frames = _task_frame()
    with _refused_and_at_rest(agent, case):
        sock = _greeted(agent)
        fds = make()
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendmsg([_head(frames, sizes)], _rights(fds) if fds else [])
                if not sizes[0] & D:
                    sock.sendall(frames[3])  # the bytes it said would follow
            assert _closed(sock)
        finally:
            sock.close()
            for fd in fds:
                os.close(fd)
    client = _client(agent)  # and it serves on
    try:
        assert _submit(client, _probe, np.ones(2 * MIB, np.uint8))[1] == 1
    finally:
        client.close()


def _sent_beside_a_head(sock: socket.socket, fds: list[int]) -> None:
    """Descriptors with a frame's buffer bytes, not its head; then a frame without buffers."""
    frames = _task_frame()
    body = memoryview(frames[3]).cast("B")
    sock.sendall(_head(frames, [_SIZE]))
    sock.sendmsg([body[:4096]], _rights(fds))
    sock.sendall(body[4096:])
    sock.sendall(b"".join(protocol.encode(Cancel(7))))


#: Descriptors where no frame declares any: the agent's reads of small frames take the
#: shortest path (no buffers, nothing waiting), which must not let these through.
STRAY: dict[str, Callable[[socket.socket, list[int]], Any]] = {
    "with a frame without buffers": lambda sock, fds: sock.sendmsg(
        [b"".join(protocol.encode(Cancel(7)))], _rights(fds)),
    "with a frame's buffer bytes": _sent_beside_a_head,
}


@pytest.mark.parametrize("case", sorted(STRAY))
def test_stray_descriptors_are_refused(agent: Agent, case: str) -> None:
    with _refused_and_at_rest(agent, case):
        sock = _greeted(agent)
        fds = [_memfd(_SIZE)]
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                STRAY[case](sock, fds)
            assert _closed(sock)
        finally:
            sock.close()
            os.close(fds[0])


def test_descriptors_before_the_token_are_refused(agent: Agent) -> None:
    before = _fds(agent.pid)
    fd = _memfd(_SIZE)
    try:
        sock = _greeted(agent, [fd])
        with sock:
            assert closed_without_greeting(sock)
    finally:
        os.close(fd)
    assert wait_until(lambda: _fds(agent.pid) <= before, 10)
    assert wait_until(lambda: "from the local socket" in _log(agent), 10)


def test_descriptors_declared_over_tcp_are_refused(agent: Agent) -> None:
    frames = _task_frame()
    with agent.connect() as sock:
        sock.sendall(protocol.HEADER.pack(len(TOKEN), protocol.RAW) + TOKEN.encode())
        assert isinstance(protocol.Channel(sock).receive()[0], Welcome)
        sock.sendall(_head(frames, [D | _SIZE]))
        assert _closed(sock)


def test_the_client_sends_bytes_unless_the_agent_takes_descriptors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    left, right = socket.socketpair()
    with left, right:
        offering = Welcome(node=0, pid=1, python="3", protocol=protocol.PROTOCOL_VERSION,
                           descriptors=True)
        assert isinstance(fd_channel.channel(left, offering), fd_channel.DescriptorChannel)
        # An older agent's Welcome has no such field: it reads as not offered.
        older = Welcome.__new__(Welcome)
        older.__setstate__([0, 1, "3", 3, 0])  # type: ignore[attr-defined]
        assert not getattr(older, "descriptors", False)
        for welcome in (older, Welcome(node=0, pid=1, python="3", protocol=3)):
            assert type(fd_channel.channel(left, welcome)) is protocol.Channel
        monkeypatch.setenv(fd_channel.ENABLED_ENV, "0")
        assert type(fd_channel.channel(left, offering)) is protocol.Channel
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with tcp:
        monkeypatch.delenv(fd_channel.ENABLED_ENV)
        assert type(fd_channel.channel(tcp, offering)) is protocol.Channel


def test_a_frame_is_rewritten_with_its_large_buffers_as_sealed_memfds() -> None:
    big, small = np.arange(3 * MIB, dtype=np.uint8), np.arange(100_000, dtype=np.uint8)
    frames = protocol.encode(Task(1, "f", b"p", 60, (pickle.PickleBuffer(big),
                                                     pickle.PickleBuffer(small))))
    head, rest, fds = fd_channel.as_descriptors(frames)
    try:
        assert len(fds) == 1 and [memoryview(v).nbytes for v in rest] == [small.nbytes]
        table = head[2]
        sizes = [protocol.SIZE.unpack_from(table, protocol.COUNT.size + i * 8)[0]
                 for i in range(2)]
        assert sizes == [D | big.nbytes, small.nbytes]
        fd_buffers.check(fds[0], big.nbytes)  # what the agent checks
        with open(fds[0], "rb", closefd=False) as memfd:
            assert memfd.read() == big.tobytes()
        with pytest.raises(PermissionError):
            os.pwrite(fds[0], b"x", 0)
    finally:
        for fd in fds:
            os.close(fd)
    # A frame without large buffers is left as it was.
    plain = protocol.encode(Task(1, "f", b"p", 60, (pickle.PickleBuffer(small),)))
    assert fd_channel.as_descriptors(plain) == (plain, [], [])
