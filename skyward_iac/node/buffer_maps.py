"""A large or kept argument reaches a node's workers as a sealed memfd, mapped privately by each
task.

A large buffer arrives from the client into a memfd (``relay.Arriving``, node/relay.py): once
all of it is there, the memfd is sealed (no write, grow or shrink any more) and the worker that
runs the task is sent its descriptor instead of the bytes, so the bytes are written once on the
node, by the agent's TLS or socket read, and never copied again. An argument the agent keeps
(node/buffer_cache.py) is that same memfd for every later task; one that arrived any other way
(more buffers in a frame than are relayed) is copied once into a memfd, sealed with
``F_SEAL_WRITE``, when a task first needs it; one a Local client handed over is its own memfd,
kept or lent (node/fd_buffers.py). A worker is sent the memfd's descriptor
(``SCM_RIGHTS`` on a socket pair of its own, the *maps* socket, beside the frames' one) and a
``Mapped`` in the task in place of the bytes; the worker maps it ``MAP_PRIVATE`` when the task
starts (``Lease``): no copy, the pages are the memfd's until a task writes one (copy on
write), so a task that changes its argument changes only its own copy and never what the next
task sees.

Mapping 100 MB afresh for every task costs its page faults and unmapping, 40-70 ms here (more
than summing it): so when a task is done, its mapping serves the next task on the same memfd
if no page of it was written (``/proc/self/pagemap`` says which pages are the task's own
copies) and nothing refers to it any more (a view or an array the result holds would keep a
reference; the task's ``Result`` says so: ``let_go``, which lets the client write a lent
memfd again), the pages looked at (5-10 ms per 100 MB) once the result has left
(``MapsReceiver.settle``). Only one task uses a mapping at a time. A worker
keeps at most ``IDLE_KEPT`` such mappings, each at most ``IDLE_SECONDS`` after its last task,
so memory of an argument the agent forgot (evicted, or its client gone) is let go soon after.

What is left, and what it costs: the memfd's pages, allocated as the bytes arrive; a fresh
mapping's faults when no clean one is at hand (a buffer no later task can use, not kept, is
never kept idle: ``Mapped.reuse``); nothing per task on the wire.

Why a socket of its own: descriptors travel with bytes, and the frames' socket is read by
``recv_into`` into buffers, which would drop them. On the maps socket every record is 8 bytes
(the ``Mapped`` serial) with one descriptor, sent just before the frame that needs it and read
by the worker as it unpacks that frame; the worker checks the serials match.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import itertools
import mmap
import os
import socket
import struct
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from skyward_iac.node import protocol
from skyward_iac.node.messages import Task
from skyward_iac.node.shared_refs import Mapped

#: One record on the maps socket: the serial of the ``Mapped`` its descriptor is for.
RECORD = struct.Struct("!Q")
_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
#: The maps socket's buffers: room for far more records than tasks a worker is sent ahead.
_SOCKET_BUFFER = 1 << 20
#: A worker keeps at most this many clean mappings of kept buffers for later tasks...
IDLE_KEPT = 4
#: ... each for at most this long after its last task.
IDLE_SECONDS = 2.0


class Kept:
    """A buffer an agent keeps for its client's later tasks: the buffer it arrived in, until a
    second task needs it; from then on a sealed memfd (``memfd``)."""

    __slots__ = ("__weakref__", "_fd", "_lock", "_origin", "_source", "size")

    def __init__(self, source: Any) -> None:
        with memoryview(source) as view:
            self.size = view.nbytes
            #: What the bytes are read into (an ``relay.Arriving`` while they still come).
            self._origin: Any = view.obj
        self._source: Any = source
        self._fd: int | None = None
        self._lock = threading.Lock()

    @property
    def lost(self) -> bool:
        """Whether its bytes will never all arrive (the client left mid-frame)."""
        return self._fd is None and bool(getattr(self._origin, "lost", False))

    def memfd(self) -> int:
        """The sealed memfd holding the bytes, had on the first call: the one they arrived in
        (``relay.Arriving``), once they all have (``relay.SourceLost`` if they never will), or
        else a copy made now."""
        with self._lock:
            if self._fd is None and _memfd_backed(self._origin, self.size):
                self._fd = self._origin.memfd()  # the origin owns it, and is kept with it
            elif self._fd is None:
                fd = os.memfd_create("skyward-kept", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
                try:
                    os.ftruncate(fd, self.size)
                    # protocol.send waits for a buffer still arriving and writes it as it comes.
                    protocol.send(_FileWriter(fd), [self._source])
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
                weakref.finalize(self, os.close, fd)
                self._source = self._origin = None  # the arrival buffer goes with its tasks
            return self._fd

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError("a kept buffer goes to a worker as a memfd (buffer_maps.MapsSender)")


class _FileWriter:
    """``sendall`` as ``protocol.send`` calls it, writing a file from its start."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def recv(self, size: int, /) -> bytes:  # a ByteStream's; never called
        raise OSError("a memfd being filled is not read")

    def sendall(self, data: bytes | memoryview, /) -> None:
        with memoryview(data) as view:
            written = 0
            while written < view.nbytes:
                written += os.write(self.fd, view[written:])


class MapsSender:
    """The agent's end of one worker's maps socket."""

    def __init__(self) -> None:
        self.socket, self._theirs = socket.socketpair()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        self._serials = itertools.count(1)

    def worker_fd(self) -> int:
        """The worker's end, to pass to it (``--maps-fd``); ``started`` closes it here."""
        return self._theirs.fileno()

    def started(self) -> None:
        """The worker has its end: the agent lets go of it."""
        self._theirs.close()

    def close(self) -> None:
        self.socket.close()
        self._theirs.close()

    def for_worker(self, tasks: Sequence[Task]) -> Sequence[Task]:
        """``tasks`` as the worker is sent them: each kept or arriving buffer a ``Mapped``
        whose memfd is sent now, on the maps socket, ahead of the frame, once all its bytes are
        there (``OSError`` if the worker is gone, ``relay.SourceLost`` if they never will be)."""
        if not any(_mappable(b) for task in tasks for b in task.buffers):
            return tasks
        return [self._mapped(task) for task in tasks]

    def _mapped(self, task: Task) -> Task:
        if not any(_mappable(b) for b in task.buffers):
            return task
        buffers: list[Any] = []
        for buffer in task.buffers:
            source = _mappable(buffer)
            if source is not None:
                serial = next(self._serials)
                socket.send_fds(self.socket, [RECORD.pack(serial)], [source.memfd()])
                kept = isinstance(source, Kept)
                # A kept argument's or a lent memfd's mapping may serve a later task.
                buffer = Mapped(serial, source.size if kept else len(source),
                                reuse=kept or source.lent)
            buffers.append(buffer)
        return dataclasses.replace(task, buffers=tuple(buffers))


def _mappable(buffer: Any) -> Any:
    """What holds ``buffer``'s bytes in a memfd a worker can map (a ``Kept``, or the whole of
    an arriving buffer, ``relay.Arriving``, or a view of all of it), else None."""
    if isinstance(buffer, Kept):
        return buffer
    whole = buffer.obj if isinstance(buffer, memoryview) else buffer
    if not isinstance(whole, mmap.mmap) or getattr(whole, "fd", None) is None:
        return None
    if whole is not buffer and not (buffer.contiguous and buffer.nbytes == len(whole)):
        return None
    return whole


def _memfd_backed(buffer: Any, size: int) -> bool:
    """Whether ``buffer`` is all ``size`` bytes of an arriving buffer held in a memfd."""
    return (isinstance(buffer, mmap.mmap) and getattr(buffer, "fd", None) is not None
            and len(buffer) == size)


class MapsReceiver:
    """A worker's end of its maps socket: a task's ``Mapped`` buffers become ``MappedFile``s as
    it is received, and mappings while it runs (``Lease``)."""

    def __init__(self, fd: int) -> None:
        self.socket = socket.socket(fileno=fd)
        self._lock = threading.Lock()
        #: Per memfd and size (inode, bytes): a mapping no task uses, none wrote and nothing
        #: refers to, for the next task on it, and since when it is idle (monotonic); least
        #: recently used first.
        self._idle: OrderedDict[tuple[int, int], tuple[_Mapping, float]] = OrderedDict()
        #: Mappings tasks gave back that nothing refers to, not yet checked for written pages
        #: (``settle``: after the task's result left, off the round trip's path).
        self._returned: list[_Mapping] = []
        #: The thread that lets idle mappings go, while there are some.
        self._reaper: threading.Thread | None = None
        self._pagemap = _open_pagemap()

    def close(self) -> None:
        """Let every idle mapping go, wait for the thread that watched them, close the socket."""
        with self._lock:
            self._idle.clear()
            self._returned.clear()
            reaper = self._reaper
        if reaper is not None:
            reaper.join()
        self.socket.close()
        if self._pagemap is not None:
            os.close(self._pagemap)
            self._pagemap = None

    def resolve(self, task: Task) -> Task:
        """``task`` with each ``Mapped`` replaced by its memfd (a ``MappedFile``);
        ``ProtocolError`` if the maps socket does not hold what the task says."""
        if not task.buffers or not any(isinstance(b, Mapped) for b in task.buffers):
            return task  # most tasks: nothing to look at
        return dataclasses.replace(task, buffers=tuple(
            self._receive(b) if isinstance(b, Mapped) else b for b in task.buffers))

    def _receive(self, ref: Mapped) -> MappedFile:
        data, fds, _, _ = socket.recv_fds(self.socket, RECORD.size, 1)
        if len(data) != RECORD.size or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise protocol.ProtocolError("the maps socket ended or broke a record")
        (serial,) = RECORD.unpack(data)
        size = os.fstat(fds[0]).st_size
        if serial != ref.serial or size < ref.size:  # a lent memfd may hold more
            os.close(fds[0])
            raise protocol.ProtocolError(f"a task wants mapped buffer {ref.serial} ({ref.size} "
                                         f"bytes), the maps socket gave {serial} ({size} bytes)")
        return MappedFile(self, fds[0], ref.size, ref.reuse)

    def _take(self, file: MappedFile) -> _Mapping:
        if self._returned:
            self.settle()
        with self._lock:
            idle = self._idle.pop((file.inode, file.size), None)
        if idle is not None:
            return idle[0]
        # Private: the task's writes copy the pages they touch, and stay its own.
        return _Mapping(mmap.mmap(file.fd, file.size, flags=mmap.MAP_PRIVATE,
                                  prot=mmap.PROT_READ | mmap.PROT_WRITE), file.inode, file.reuse)

    def _give_back(self, mapping: _Mapping) -> bool:
        """A task is done with ``mapping``; whether nothing refers to it any more (no task will
        read it again: a lent memfd may then be written by its client). Such a mapping of a
        buffer later tasks may use is returned, for ``settle`` to keep or let go."""
        unreferenced = mapping.unreferenced()
        if unreferenced and mapping.reuse:
            with self._lock:
                self._returned.append(mapping)
        return unreferenced

    def settle(self) -> None:
        """Keep each returned mapping for the next task on the same memfd if no page of it
        was written (else let go: unmapped now), for ``IDLE_SECONDS`` at most: the agent may
        have let go of the memfd, whose memory this mapping holds. The worker calls it once a
        result has left: the look at the pages (5-10 ms per 100 MB) is then off the path."""
        with self._lock:
            returned, self._returned = self._returned, []
        for mapping in returned:
            key = (mapping.inode, mapping.size)
            clean = self._clean(mapping)
            with self._lock:
                if not clean or key in self._idle:
                    continue
                self._idle[key] = (mapping, time.monotonic())
                while len(self._idle) > IDLE_KEPT:
                    self._idle.popitem(last=False)
                if self._reaper is None:
                    self._reaper = threading.Thread(target=self._reap, name="maps-reaper",
                                                    daemon=True)
                    self._reaper.start()

    def _reap(self) -> None:
        """Let idle mappings go once ``IDLE_SECONDS`` old; ends when none is left."""
        while True:
            time.sleep(IDLE_SECONDS / 4)
            with self._lock:
                old = time.monotonic() - IDLE_SECONDS
                for key in [k for k, (_, since) in self._idle.items() if since < old]:
                    del self._idle[key]
                if not self._idle:
                    self._reaper = None
                    return

    def _clean(self, mapping: _Mapping) -> bool:
        """Whether no page of ``mapping`` is the task's own copy (``/proc/self/pagemap``: a
        page written since mapping is anonymous, or swapped); unreadable: not clean."""
        if self._pagemap is None:
            return False
        first, pages = mapping.address // _PAGE, -(-mapping.size // _PAGE)
        try:
            entries = os.pread(self._pagemap, pages * 8, first * 8)
        except OSError:
            return False
        return len(entries) == pages * 8 and 1 not in entries[7::8].translate(_OWN_COPY)


class MappedFile:
    """A kept buffer a worker received for a task: its memfd, mapped when the task starts."""

    __slots__ = ("__weakref__", "fd", "inode", "receiver", "reuse", "size")

    def __init__(self, receiver: MapsReceiver, fd: int, size: int, reuse: bool = True) -> None:
        self.receiver, self.fd, self.size, self.reuse = receiver, fd, size, reuse
        self.inode = os.fstat(fd).st_ino
        weakref.finalize(self, os.close, fd)


class _Mapping:
    """A private mapping of a memfd, and where it is."""

    __slots__ = ("address", "inode", "map", "reuse", "size")

    def __init__(self, mapped: mmap.mmap, inode: int, reuse: bool = True) -> None:
        self.map, self.inode, self.size, self.reuse = mapped, inode, len(mapped), reuse
        pointer = ctypes.c_char.from_buffer(mapped)
        self.address = ctypes.addressof(pointer)
        del pointer  # its export of the mapping ends here

    def unreferenced(self) -> bool:
        """Whether nothing but this object refers to the mapping (no array, view or result of
        a task): every buffer exported from it holds a reference to it."""
        return sys.getrefcount(self.map) <= _ALONE


#: What ``sys.getrefcount`` says of an object held by one attribute alone (the attribute's
#: reference and the call's own).
_ALONE = 2


class Lease:
    """A task's buffers with each ``MappedFile`` mapped, for the task's run; afterwards each
    mapping is kept for the next task on the same memfd when that is safe (see
    ``MapsReceiver._give_back``), and ``let_go`` says whether nothing refers to any of them any
    more. The caller drops its references to them by the end. A class, not a generator: every
    task of a worker goes through it, most with nothing to map."""

    __slots__ = ("_buffers", "_ready", "_taken", "let_go")

    def __init__(self, buffers: Sequence[Any]) -> None:
        self._buffers = buffers
        self._ready: list[Any] = []
        self._taken: list[tuple[MapsReceiver, _Mapping]] = []
        #: After the lease: no view, array or result of the task refers to a mapping of it.
        self.let_go = False

    def __enter__(self) -> Sequence[Any]:
        buffers = self._buffers
        if not buffers or not any(isinstance(b, MappedFile) for b in buffers):
            return buffers
        for buffer in buffers:
            if isinstance(buffer, MappedFile):
                mapping = buffer.receiver._take(buffer)
                self._taken.append((buffer.receiver, mapping))
                buffer = mapping.map
            self._ready.append(buffer)
        return self._ready

    def __exit__(self, *_: object) -> None:
        self._ready.clear()
        let_go = True
        for receiver, mapping in self._taken:
            let_go = receiver._give_back(mapping) and let_go
        self._taken.clear()
        self.let_go = let_go


def _open_pagemap() -> int | None:
    try:
        return os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


_PAGE = mmap.PAGESIZE
#: A pagemap entry's top byte (little-endian) -> 1 when its page is the task's own copy:
#: swapped (bit 62), or present (63) and not a page of the file (61).
_OWN_COPY = bytes(1 if b & 0x40 or (b & 0x80 and not b & 0x20) else 0 for b in range(256))
