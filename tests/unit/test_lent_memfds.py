"""Lent memfds against a real agent and its worker (remote/memfd_arena.py, node/buffer_maps.py):
a client's large arguments reuse one memfd call after call, and a memfd is never written while
anything on the node may still read it -- a task that keeps its argument, returns it, writes
into it or outlives its timeout."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from skyward_iac.api.function import function
from skyward_iac.remote import data_port, memfd_arena
from skyward_iac.remote.agent_client import AgentClient
from skyward_iac.remote.bootstrap import LOCAL_SOCKET_FILE
from skyward_iac.remote.calls import pack_call
from tests.agent_process import TOKEN, Agent, running_agent, wait_until

MIB = 1 << 20
SIZE = 8 * MIB


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    workdir = tmp_path_factory.mktemp("lent-memfds")
    # Two threads in one worker: a task past its timeout runs on (a lone one's process would
    # be killed), and every task sees what earlier ones kept.
    with running_agent(workdir, "--local-socket", str(workdir / LOCAL_SOCKET_FILE),
                       "--concurrency", "2") as started:
        yield started


@pytest.fixture
def client(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> Iterator[AgentClient]:
    """A client on the agent's Unix socket with an arena of its own (nothing trimmed)."""
    monkeypatch.setattr(memfd_arena, "_arena", memfd_arena.Arena(schedule=lambda *_: None))
    connected = AgentClient(data_port.connect_local(agent.workdir / LOCAL_SOCKET_FILE), TOKEN,
                            node=0)
    try:
        yield connected
    finally:
        connected.close()


def _call(client: AgentClient, fn: Any, *args: Any, timeout: float = 120) -> Any:
    packed = pack_call(function(fn)(*args), copy=False)
    return client.submit("probe", packed.payload, timeout, packed.buffers).result(120)


def _array(seed: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8)


def _seen(a: Any) -> tuple[int, int]:
    """In the worker: the crc32 of ``a`` and the inode of the handed-over memfd it lies in."""
    import zlib as z
    address = a.__array_interface__["data"][0]
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            low, high = (int(end, 16) for end in fields[0].split("-"))
            if "skyward-handed" in line and low <= address < high:
                return z.crc32(a), int(fields[4])
    raise AssertionError("the argument is not in a handed-over memfd")


def _kept(a: Any) -> tuple[int, int]:
    """In the worker: keep ``a`` past the task (as a cache would), and see it."""
    import builtins
    builtins._lent_test_kept = a  # type: ignore[attr-defined]
    return _seen(a)


def _crc_of_kept() -> int:
    import builtins
    import zlib as z
    return z.crc32(builtins._lent_test_kept)  # type: ignore[attr-defined]


def _returned(a: Any) -> Any:
    return a


def _zeroed(a: Any) -> tuple[int, int]:
    seen = _seen(a)
    a[:] = 0  # its own copy of the pages it writes (the mapping is private)
    return seen


def _slow(a: Any, path: str) -> None:
    """In the worker: read ``a`` after the client gave up on the task, into ``path``."""
    import time
    import zlib as z
    time.sleep(2)
    with open(path, "w") as out:
        out.write(str(z.crc32(a)))


def test_calls_after_calls_reuse_one_memfd(client: AgentClient) -> None:
    arrays = [_array(seed) for seed in range(4)]
    seen = [_call(client, _seen, a) for a in arrays]
    assert [crc for crc, _ in seen] == [zlib.crc32(a) for a in arrays]
    assert len({inode for _, inode in seen}) == 1  # one memfd, rewritten for each call
    assert memfd_arena.arena().held == memfd_arena.slot_size(SIZE)


def test_an_argument_a_task_keeps_is_never_written_again(client: AgentClient) -> None:
    first, second = _array(10), _array(11)
    _, kept_inode = _call(client, _kept, first)
    crc, inode = _call(client, _seen, second)
    assert crc == zlib.crc32(second) and inode != kept_inode  # another memfd
    assert _call(client, _crc_of_kept) == zlib.crc32(first)  # what it kept is unchanged
    # The memfd it keeps was let go by the client: calls go on with the new one.
    assert _call(client, _seen, _array(12))[1] == inode


def test_a_returned_argument_is_never_written_again(client: AgentClient) -> None:
    first = _array(20)
    _, before = _call(client, _seen, _array(21))
    returned = _call(client, _returned, first)
    assert np.array_equal(returned, first)
    crc, inode = _call(client, _seen, _array(22))
    assert crc == zlib.crc32(_array(22)) and inode != before


def test_a_task_that_writes_its_argument_leaves_the_memfd_as_sent(client: AgentClient) -> None:
    arrays = [_array(seed) for seed in (30, 31, 32)]
    seen = [_call(client, _zeroed, a) for a in arrays]
    assert [crc for crc, _ in seen] == [zlib.crc32(a) for a in arrays]
    assert len({inode for _, inode in seen}) == 1  # let go: reused, never seen zeroed


def test_a_task_past_its_timeout_keeps_its_argument(client: AgentClient,
                                                    tmp_path: Path) -> None:
    slow, report = _array(40), tmp_path / "crc"
    with pytest.raises(TimeoutError):
        _call(client, _slow, slow, str(report), timeout=0.5)
    # Sent while the slow task still reads its argument: into another memfd.
    later = _array(41)
    assert _call(client, _seen, later)[0] == zlib.crc32(later)
    assert wait_until(report.exists, 30)
    assert wait_until(lambda: report.read_text() == str(zlib.crc32(slow)), 5)


def test_with_the_arena_off_each_call_gets_a_fresh_memfd(agent: Agent,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memfd_arena.ENABLED_ENV, "0")
    off = AgentClient(data_port.connect_local(agent.workdir / LOCAL_SOCKET_FILE), TOKEN, node=0)
    try:
        arrays = [_array(seed) for seed in (50, 51, 52)]
        seen = [_call(off, _seen, a) for a in arrays]
    finally:
        off.close()
    assert [crc for crc, _ in seen] == [zlib.crc32(a) for a in arrays]
    assert len({inode for _, inode in seen}) == 3
