"""The client's reused memfds (remote/memfd_arena.py), without an agent: size classes, what a
slot's seals allow, reuse only after a task let go, and the limits on what is kept idle."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from skyward_iac.node import fd_buffers
from skyward_iac.node.messages import Task
from skyward_iac.node.shared_refs import Keep, Use
from skyward_iac.remote import fd_channel, memfd_arena
from skyward_iac.remote.memfd_arena import Arena, Loans, Slot, slot_size

MIB = 1 << 20


def _bytes(seed: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size, dtype=np.uint8)


class _Timers:
    """``Arena``'s ``schedule``: what it asked to run, run when the test says."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, Callable[[], Any]]] = []

    def __call__(self, when: float, call: Callable[[], Any]) -> None:
        self.calls.append((when, call))

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for _, call in calls:
            call()


@pytest.mark.parametrize("nbytes", [1, 4095, 4096, MIB - 1, MIB, MIB + 1, 3 * MIB + 7,
                                    100 * MIB, 100_000_000, 2**33 + 5])
def test_a_size_class_holds_the_buffer_and_wastes_at_most_a_sixteenth(nbytes: int) -> None:
    size = slot_size(nbytes)
    assert size >= nbytes and size % mmap.PAGESIZE == 0
    assert size - nbytes <= max(mmap.PAGESIZE, nbytes // 16)
    assert slot_size(size) == size  # a class is its own class


def test_a_slot_is_written_only_through_its_own_mapping() -> None:
    data = _bytes(1, 2 * MIB)
    slot = Slot.holding(memoryview(data))
    try:
        assert bytes(slot[:data.nbytes]) == data.tobytes()
        # What the agent checks of a handed-over memfd passes...
        fd_buffers.check(slot.fd, data.nbytes)
        # ...and nobody else can write it, map it writable, shrink or grow it.
        with pytest.raises(PermissionError):
            os.pwrite(slot.fd, b"x", 0)
        with pytest.raises(PermissionError):
            mmap.mmap(slot.fd, len(slot), flags=mmap.MAP_SHARED)
        for size in (len(slot) - mmap.PAGESIZE, len(slot) + mmap.PAGESIZE):
            with pytest.raises(PermissionError):
                os.ftruncate(slot.fd, size)
        with pytest.raises(PermissionError):
            fcntl.fcntl(slot.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        # Its own mapping still writes, and another mapping (a worker's) sees it.
        reader = mmap.mmap(slot.fd, data.nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        other = _bytes(2, 2 * MIB)
        slot.fill(memoryview(other))
        assert reader[:] == other.tobytes()
        reader.close()
    finally:
        slot.close()


def test_a_slot_given_back_is_reused_for_its_size_class_only() -> None:
    arena = Arena(schedule=_Timers())
    first = arena.lend(_bytes(1, 4 * MIB))
    arena.give_back(first)
    assert arena.held == len(first)
    again = _bytes(2, 4 * MIB - 100)  # the same class
    slot = arena.lend(again)
    assert slot is first and arena.held == 0
    assert bytes(slot[:again.nbytes]) == again.tobytes()
    other = arena.lend(_bytes(3, 8 * MIB))  # another class: a new slot
    assert other is not first
    # A slot lent and not given back is never lent again.
    assert arena.lend(_bytes(4, 4 * MIB)) is not first


def test_idle_slots_stay_within_their_bytes_and_their_time() -> None:
    timers = _Timers()
    arena = Arena(idle_bytes=10 * MIB, idle_seconds=0.0, schedule=timers)
    slots = [arena.lend(_bytes(i, 4 * MIB)) for i in range(3)]
    for slot in slots:
        arena.give_back(slot)
    # 12 MiB given back, 10 kept: the oldest is retired (unmapped).
    assert arena.held == 8 * MIB and slots[0].closed and not slots[2].closed
    big = arena.lend(_bytes(9, 16 * MIB))
    arena.give_back(big)  # larger than all it may keep: retired at once
    assert big.closed and arena.held == 8 * MIB
    assert len(timers.calls) == 1  # one trimming at a time
    timers.run()  # idle_seconds (0) have passed
    assert arena.held == 0 and all(slot.closed for slot in slots)
    assert not timers.calls  # nothing left to trim: it stops


def test_a_retired_slot_still_being_sent_is_unmapped_after_the_send() -> None:
    arena = Arena(schedule=_Timers())
    slot = arena.lend(_bytes(1, 2 * MIB))
    view = slot.view(2 * MIB)
    fd = slot.fd
    memfd_arena.retire(slot)
    assert not slot.closed and bytes(view[:4]) == _bytes(1, 4).tobytes()  # still readable
    os.fstat(fd)  # and its descriptor open for the send
    view.release()
    memfd_arena.retire(slot)
    assert slot.closed
    del slot
    with pytest.raises(OSError) as failed:
        os.fstat(fd)
    assert failed.value.errno == errno.EBADF


def _task(task_id: int, *buffers: Any) -> Task:
    return Task(task_id, "f", b"payload", None, buffers)


def test_loans_lend_a_tasks_own_large_buffers_only() -> None:
    loans = Loans(Arena(schedule=_Timers()))
    large, small = _bytes(1, 2 * MIB), _bytes(2, 1000)
    keep = Keep(b"d" * 16, _bytes(3, 2 * MIB), ())
    use = Use(b"e" * 16, 2 * MIB)
    [sent] = loans.lend([_task(1, memoryview(large), memoryview(small), keep, use)])
    lent, *rest = sent.buffers
    assert memfd_arena.lent_slot(lent) is not None and bytes(lent) == large.tobytes()
    assert rest == [sent.buffers[1], keep, use] and memfd_arena.lent_slot(rest[0]) is None
    # As the frame goes: the lent one as its slot's descriptor marked LENT, the small one as
    # bytes, the kept argument's (the agent keeps them) as a fresh sealed memfd.
    from skyward_iac.node import protocol
    head, _, fds = fd_channel.as_descriptors(protocol.encode(sent))
    try:
        (count,) = protocol.COUNT.unpack_from(head[2])
        sizes = [protocol.SIZE.unpack_from(head[2], 4 + 8 * i)[0] for i in range(count)]
        assert [s & (fd_buffers.DESCRIPTOR | fd_buffers.LENT) for s in sizes] == [
            fd_buffers.DESCRIPTOR | fd_buffers.LENT, 0, fd_buffers.DESCRIPTOR]
        assert os.fstat(fds[0]).st_ino == os.fstat(memfd_arena.lent_slot(lent).fd).st_ino
        assert fcntl.fcntl(fds[1], fcntl.F_GET_SEALS) & fcntl.F_SEAL_WRITE
    finally:
        for fd in fds:
            os.close(fd)


def test_a_slot_comes_back_only_when_its_task_let_go() -> None:
    arena = Arena(schedule=_Timers())
    loans = Loans(arena)

    def lent(task_id: int, seed: int) -> Slot:
        [task] = loans.lend([_task(task_id, memoryview(_bytes(seed, 2 * MIB)))])
        slot = memfd_arena.lent_slot(task.buffers[0])
        assert slot is not None
        return slot

    kept = lent(1, 1)
    loans.ended(1, let_go=False)  # its worker still refers to it: never written again
    assert kept.closed and arena.held == 0
    given = lent(2, 2)
    assert given is not kept
    loans.ended(2, let_go=True)
    assert arena.held == len(given)
    assert lent(3, 3) is given  # reused, rewritten
    pending = lent(4, 4)
    loans.close()  # the connection is over: what is still lent is retired
    loans.ended(3, let_go=True)  # a late result changes nothing
    assert arena.held == 0 and pending.closed and not loans
    loans.lend([_task(5, memoryview(_bytes(5, 2 * MIB)))])  # its send fails: not tracked
    assert not loans and arena.held == 0


def test_the_last_connection_closed_frees_every_idle_slot() -> None:
    arena = Arena(schedule=_Timers())
    one, two = Loans(arena), Loans(arena)
    [task] = one.lend([_task(1, memoryview(_bytes(1, 2 * MIB)))])
    slot = memfd_arena.lent_slot(task.buffers[0])
    del task
    one.ended(1, let_go=True)
    assert arena.held == len(slot)
    one.close()
    one.close()  # closing twice counts once
    assert arena.held == len(slot)  # another connection may still reuse it
    two.close()  # the pool is over: nothing is kept
    assert arena.held == 0 and slot.closed
