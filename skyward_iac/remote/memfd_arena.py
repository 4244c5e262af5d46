"""Memfds a Local client writes large arguments into and reuses: each lent to one task at a time.

Over a Local agent's Unix socket a large buffer goes as a memfd (remote/fd_channel.py). Writing
100 MiB into a fresh memfd costs 70-90 ms here, about 40 % of it allocating pages (shmem has no
huge pages); into pages that exist and are mapped, ~20 ms. So the client keeps what it wrote:

- A *slot* is a memfd and the client's one writable, shared mapping of it, made before the
  memfd is sealed (``F_SEAL_FUTURE_WRITE``, ``F_SEAL_SHRINK``, ``F_SEAL_GROW``,
  ``F_SEAL_SEAL``): nobody can write it any more but through that mapping, nor resize it. A new
  slot is filled with ``pwrite`` (the fastest way into fresh pages), a reused one through its
  mapping, its pages faulted in at once the first time (``MADV_POPULATE_WRITE``). Its size is
  the buffer's rounded up to a size class (at most 1/16 more), so arguments of nearby sizes
  reuse it; the node maps only the buffer's bytes.
- ``Loans`` (one per agent connection) lends slots to the tasks it sends: a task's large plain
  buffers (not a shared argument, which the agent keeps: node/buffer_cache.py) are copied into
  slots, sent as their descriptors with ``fd_buffers.LENT``, and the slots are the task's until
  it ends. A slot comes back for reuse only when the task's ``Result`` says ``let_go`` (its
  worker holds no view, array or result of it any more: node/buffer_maps.py); any other end
  (a failure the node could not vouch for, a timeout, a lost or closed connection) *retires* it:
  the client lets go of it and never writes it again, and its pages are freed when the node
  lets go too.
- The ``Arena`` (one per process: every Local agent runs on this machine) keeps slots given
  back, at most ``IDLE_BYTES`` in all, each at most ``IDLE_SECONDS`` after it was given back,
  and none once the last connection that lends them is closed (a pool's end frees them).

``SKYWARD_LOCAL_ARENA=0`` turns it off (read per connection): each buffer then goes as a fresh
sealed memfd, as before.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from skyward_iac.api.switches import switched_on
from skyward_iac.node import fd_buffers
from skyward_iac.node.messages import Task
from skyward_iac.node.shared_refs import IN_BAND

ENABLED_ENV = "SKYWARD_LOCAL_ARENA"
#: Bytes of slots kept for reuse at most, in all...
IDLE_BYTES = 1 << 30
#: ... each at most this long after it was given back.
IDLE_SECONDS = 10.0
#: What a slot is sealed with: only its own mapping, made before, writes it.
SLOT_SEALS = (fd_buffers._F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
              | fcntl.F_SEAL_SEAL)
#: ``madvise(MADV_POPULATE_WRITE)`` (Linux 5.14; Python 3.11 has no name for it).
_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_PAGE = mmap.PAGESIZE
#: Bytes copied into a slot at a time (the GIL is held for each piece).
_FILL_PIECE = 4 << 20


def enabled() -> bool:
    """Whether large arguments go in reused memfds (``SKYWARD_LOCAL_ARENA`` not off)."""
    return switched_on(ENABLED_ENV)


def slot_size(nbytes: int) -> int:
    """The size class of a ``nbytes`` buffer: rounded up to a 16th of its power of two, at
    least a page (pure)."""
    granule = max(_PAGE, 1 << max(0, nbytes.bit_length() - 5))
    return -(-nbytes // granule) * granule


class Slot(mmap.mmap):
    """A slot: its memfd (``fd``, closed with the object) mapped shared and writable; how much
    of it has its pages mapped here."""

    fd: int
    populated: int
    idle_since: float

    @classmethod
    def holding(cls, data: memoryview) -> Slot:
        """A new slot holding ``data``'s bytes (C-contiguous bytes), sealed."""
        fd = written_memfd(data, slot_size(data.nbytes))
        try:
            slot = cls(fd, slot_size(data.nbytes), flags=mmap.MAP_SHARED)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SLOT_SEALS)
        except BaseException:
            os.close(fd)
            raise
        # Closed once nothing refers to the slot (a frame being sent still may when retired).
        slot.fd = fd
        weakref.finalize(slot, os.close, fd)
        slot.populated = 0  # mapped, no page of it faulted in here yet
        slot.idle_since = 0.0
        return slot

    def fill(self, data: memoryview) -> None:
        """Write ``data`` at the slot's start (it must fit), through the mapping."""
        if data.nbytes > self.populated:
            start = self.populated
            length = min(len(self), -(-data.nbytes // _PAGE) * _PAGE) - start
            try:
                self.madvise(_POPULATE_WRITE, start, length)
            except OSError:
                pass  # an older kernel: the copy faults them in
            self.populated = start + length
        # In pieces: a slice assignment copies holding the GIL, and 100 MiB at once would stall
        # every other thread of the client (the wire loop among them) for ~25 ms.
        for start in range(0, data.nbytes, _FILL_PIECE):
            end = min(start + _FILL_PIECE, data.nbytes)
            self[start:end] = data[start:end]

    def view(self, nbytes: int) -> memoryview:
        """Its first ``nbytes``, to send."""
        return memoryview(self)[:nbytes]


def written_memfd(data: memoryview, size: int) -> int:
    """A new sealable memfd of ``size`` bytes starting with ``data``'s (C-contiguous bytes),
    written with ``pwrite``: the fastest way into fresh shmem pages."""
    fd = os.memfd_create(fd_buffers.MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        written = 0
        while written < data.nbytes:
            written += os.pwrite(fd, data[written:], written)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lent_slot(view: Any) -> Slot | None:
    """The slot ``view`` (a frame's out-of-band view) shows the start of, if any."""
    owner = view
    while isinstance(owner, memoryview):
        owner = owner.obj
    return owner if isinstance(owner, Slot) else None


class Arena:
    """The slots given back and not reused yet, by size class, within ``idle_bytes``, each
    retired ``idle_seconds`` after it was given back (``schedule(when, call)`` runs the
    trimming; by default on the wire loop)."""

    def __init__(self, idle_bytes: int = IDLE_BYTES, idle_seconds: float = IDLE_SECONDS,
                 schedule: Callable[[float, Callable[[], Any]], Any] | None = None) -> None:
        self.idle_bytes = idle_bytes
        self.idle_seconds = idle_seconds
        self._schedule = schedule or _on_wire_loop
        self._idle: dict[int, list[Slot]] = {}
        self._held = 0
        self._trimming = False
        self._lenders = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes of idle slots kept."""
        return self._held

    def lend(self, buffer: Any) -> Slot:
        """A slot holding ``buffer``'s bytes: an idle one of its size class refilled, else a
        new one."""
        with memoryview(buffer) as view, view.cast("B") as data:
            with self._lock:
                idle = self._idle.get(slot_size(data.nbytes))
                slot = idle.pop() if idle else None
                if slot is not None:
                    self._held -= len(slot)
            if slot is None:
                return Slot.holding(data)
            try:
                slot.fill(data)
            except BaseException:
                retire(slot)
                raise
            return slot

    def lender_opened(self) -> None:
        """A connection that lends slots (``Loans``) is open."""
        with self._lock:
            self._lenders += 1

    def lender_closed(self) -> None:
        """One is closed: with none left (its pool is over), every idle slot is retired."""
        with self._lock:
            self._lenders -= 1
            last = self._lenders <= 0
        if last:
            self.clear()

    def give_back(self, slot: Slot) -> None:
        """``slot``'s task let go of it: kept for reuse, the oldest idle ones retired to stay
        within ``idle_bytes``."""
        if len(slot) > self.idle_bytes:
            retire(slot)
            return
        retired: list[Slot] = []
        with self._lock:
            slot.idle_since = time.monotonic()
            self._idle.setdefault(len(slot), []).append(slot)
            self._held += len(slot)
            while self._held > self.idle_bytes:
                retired.append(self._take_oldest())
            start = not self._trimming
            self._trimming = True
        for old in retired:
            retire(old)
        if start:
            self._schedule(time.monotonic() + self.idle_seconds, self.trim)

    def trim(self) -> None:
        """Retire the slots idle for ``idle_seconds``; come again while some are kept."""
        old: list[Slot] = []
        with self._lock:
            limit = time.monotonic() - self.idle_seconds
            for size, slots in list(self._idle.items()):
                keep = [s for s in slots if s.idle_since > limit]
                old += [s for s in slots if s.idle_since <= limit]
                if keep:
                    self._idle[size] = keep
                else:
                    del self._idle[size]
            self._held -= sum(len(s) for s in old)
            self._trimming = bool(self._idle)
            again = self._trimming
        for slot in old:
            retire(slot)
        if again:
            self._schedule(time.monotonic() + self.idle_seconds / 2, self.trim)

    def clear(self) -> None:
        """Retire every idle slot."""
        with self._lock:
            slots = [s for each in self._idle.values() for s in each]
            self._idle.clear()
            self._held = 0
        for slot in slots:
            retire(slot)

    def _take_oldest(self) -> Slot:
        size, slots = min(self._idle.items(), key=lambda item: item[1][0].idle_since)
        oldest = slots.pop(0)
        if not slots:
            del self._idle[size]
        self._held -= len(oldest)
        return oldest


def retire(slot: Slot) -> None:
    """Never write ``slot`` again: unmapped now, or when its last view (a frame being sent)
    goes; its memory is freed once no node maps it either."""
    try:
        slot.close()
    except BufferError:
        pass  # exported still: the mapping goes with the last view


def _on_wire_loop(when: float, call: Callable[[], Any]) -> Any:
    from skyward_iac.remote.wire_loop import wire_loop

    return wire_loop().call_at(when, call)


_arena: Arena | None = None
_arena_lock = threading.Lock()


def arena() -> Arena:
    """This process's arena."""
    global _arena
    with _arena_lock:
        if _arena is None:
            _arena = Arena()
        return _arena


class Loans:
    """The slots one agent connection's tasks hold, by task id."""

    def __init__(self, source: Arena) -> None:
        self.arena = source
        self._lent: dict[int, list[Slot]] = {}
        self._lock = threading.Lock()
        self._closed = False
        source.lender_opened()

    def __bool__(self) -> bool:
        return bool(self._lent)

    def lend(self, messages: Sequence[Any]) -> Sequence[Any]:
        """``messages`` as they are sent: each task's large plain buffers copied into slots
        lent to it (``fd_channel`` sends those as lent descriptors)."""
        if not any(isinstance(m, Task) and _lendable(m.buffers) for m in messages):
            return messages
        return [self._lent_to(m) if isinstance(m, Task) and _lendable(m.buffers) else m
                for m in messages]

    def _lent_to(self, task: Task) -> Task:
        slots: list[Slot] = []
        buffers: list[Any] = []
        try:
            for buffer in task.buffers:
                if _large_plain(buffer):
                    slot = self.arena.lend(buffer)
                    slots.append(slot)
                    buffer = slot.view(memoryview(buffer).nbytes)
                buffers.append(buffer)
        except BaseException:
            for slot in slots:
                retire(slot)
            raise
        with self._lock:
            if self._closed:
                slots, closed = [], slots
            else:
                self._lent.setdefault(task.task_id, []).extend(slots)
                closed = []
        for slot in closed:
            retire(slot)  # the connection closed meanwhile: the send fails
        return Task(task.task_id, task.name, task.payload, task.timeout, tuple(buffers))

    def ended(self, task_id: int, let_go: bool) -> None:
        """Task ``task_id`` ended: its slots are given back if its worker let go of them,
        else retired."""
        with self._lock:
            slots = self._lent.pop(task_id, None)
        for slot in slots or ():
            if let_go:
                self.arena.give_back(slot)
            else:
                retire(slot)

    def close(self) -> None:
        """The connection is over: every slot still lent is retired."""
        with self._lock:
            first, self._closed = not self._closed, True
            lent, self._lent = self._lent, {}
        for slots in lent.values():
            for slot in slots:
                retire(slot)
        if first:
            self.arena.lender_closed()


def _lendable(buffers: Sequence[Any]) -> bool:
    for buffer in buffers:
        if _large_plain(buffer):
            return True
    return False


def _large_plain(buffer: Any) -> bool:
    """Whether ``buffer`` is a task's own bytes (not a shared argument's reference or bytes the
    agent keeps) large enough to go as a descriptor."""
    if isinstance(buffer, IN_BAND):
        return False
    try:
        with memoryview(buffer) as view:
            return view.nbytes >= fd_buffers.DESCRIPTOR_MIN and view.c_contiguous
    except TypeError:
        return False
