"""Large buffers handed over as sealed memfds on a Local node's Unix socket, not as bytes.

Over the local socket (node/local_socket.py) the client and the agent share a kernel, so a large
out-of-band buffer need not cross the socket at all: the client writes it once into a fresh
memfd, seals it (no write, grow or shrink any more) and sends the descriptor with the frame
(``SCM_RIGHTS``); the agent checks it and hands that very memfd to the worker (node/buffer_maps.py)
as it does a buffer that arrived as bytes (``relay.Arriving``). One copy of the bytes on the
node (the client's write) instead of three (the client's send, the agent's receive, its
``pwrite`` into the memfd).

The wire: a size-table entry with ``DESCRIPTOR`` set says that buffer comes as a descriptor of
the size in the other bits, and none of its bytes follow; the descriptors go with the frame's
first bytes (its header), all of them in one ``sendmsg``. The agent reads such a socket only with
``recvmsg`` (``DescriptorReader``: a plain ``recv`` would have the kernel close them unseen),
noting where in the stream each batch of descriptors came. A frame's descriptors must have
come while its head was read, exactly as many as it declares, at most ``MAX_DESCRIPTORS``;
each must be a memfd of at least the declared size sealed against writes (``F_SEAL_WRITE`` or
``F_SEAL_FUTURE_WRITE``) and shrinking. Anything else (descriptors before the token, stray
ones, too many, a pipe, an unsealed or too small memfd) is a ``ProtocolError``: the
connection is closed, and every descriptor received on it is closed with it.

A *lent* memfd (``LENT`` set beside ``DESCRIPTOR``: remote/memfd_arena.py) is one the client
will write again for a later task, through the one writable mapping it made before sealing
it with ``F_SEAL_FUTURE_WRITE``: it does so only after the task's ``Result`` said
``let_go`` (the worker holds nothing of it any more). A lent memfd may be larger than the
buffer (a size class): only the declared bytes are mapped. Its worker keeps its mapping for
the next task on it (``Mapped.reuse``), as it does a kept argument's.

What the seals guarantee: nobody can shrink the memfd (a worker's mapping can never fault
past its end), grow it (from our client) or write it through ``write`` or a new mapping. With
``F_SEAL_FUTURE_WRITE`` alone (which the agent accepts, as it uses it itself) a writable
mapping the sender made before sealing still writes: our client's lent memfds are written so,
between their tasks; a process of the agent's own user holding the token could send such a
memfd and write it mid-task, but such a process could change the agent's memory anyway
(``ptrace``): it would only hurt its own tasks.

Only the local socket carries descriptors, and a client sends them only to an agent whose
``Welcome`` says it takes them (``Welcome.descriptors``): an older agent, or any TLS or SSH
connection, gets bytes as before, and an entry with ``DESCRIPTOR`` set on those is refused.
"""

from __future__ import annotations

import array
import fcntl
import os
import socket
import stat
import threading
from collections.abc import Callable
from typing import Any

from skyward_iac.node import protocol

#: Set in a size-table entry: that buffer comes as a descriptor, of the size in the other bits.
DESCRIPTOR = 1 << 63
#: Set with ``DESCRIPTOR``: the client lends that memfd and will write it again once the task
#: let go of it (see the module doc).
LENT = 1 << 62
_FLAGS = DESCRIPTOR | LENT
#: At most this many descriptors in one frame (more are refused).
MAX_DESCRIPTORS = 64
#: Buffers at least this large go as descriptors (smaller ones cost less as bytes).
DESCRIPTOR_MIN = protocol.LAZY_MIN
#: Room for the most descriptors one read may bring; more set ``MSG_CTRUNC`` and are refused.
_ANCILLARY = socket.CMSG_SPACE(MAX_DESCRIPTORS * array.array("i").itemsize)
#: ``socket.MSG_CTRUNC`` as a plain int: ``int & IntFlag`` goes through ``enum`` (~2.5 us a
#: read, every read of a Local client's frames).
_MSG_CTRUNC = int(socket.MSG_CTRUNC)
_F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
#: The seals a handed-over memfd must have, one of the first two at least and the third.
_NO_WRITE = fcntl.F_SEAL_WRITE | _F_SEAL_FUTURE_WRITE
#: The name of a client's memfd (``/proc/PID/maps`` shows where one is mapped).
MEMFD_NAME = "skyward-handed"
#: What the client seals (``F_SEAL_WRITE``: it has no mapping of the memfd).
CLIENT_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class DescriptorReader:
    """A Unix socket read only with ``recvmsg``: the descriptors that come with its bytes are
    kept, each batch with the stream offset its read ended at, until a frame claims them
    (``claim``) or the connection ends (``close``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        #: Bytes read from the socket so far.
        self.received = 0
        self._batches: list[tuple[int, list[int]]] = []
        self._lock = threading.Lock()

    def recv(self, size: int, /) -> bytes:
        data, ancillary, flags, _ = self.sock.recvmsg(size, _ANCILLARY)
        self._took(len(data), ancillary, flags)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, /) -> int:
        with memoryview(buffer) as view:
            target = view[:nbytes or len(view)]
            n, ancillary, flags, _ = self.sock.recvmsg_into([target], _ANCILLARY)
        self._took(n, ancillary, flags)
        return n

    def _took(self, n: int, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        self.received += n  # only the connection's one reading thread reads
        if ancillary or flags & _MSG_CTRUNC:
            self._keep(ancillary, flags)

    def _keep(self, ancillary: list[tuple[int, int, bytes]], flags: int) -> None:
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
        if fds:
            with self._lock:
                self._batches.append((self.received, list(fds)))
        if flags & _MSG_CTRUNC:
            raise protocol.ProtocolError(f"more than {MAX_DESCRIPTORS} descriptors at once")

    def take_through(self, offset: int) -> list[tuple[int, list[int]]]:
        """The batches of descriptors whose read ended at or before ``offset``, now the
        caller's to close."""
        with self._lock:
            taken = [batch for batch in self._batches if batch[0] <= offset]
            self._batches = [batch for batch in self._batches if batch[0] > offset]
        return taken

    def holds_any(self) -> bool:
        with self._lock:
            return bool(self._batches)

    def discard(self) -> None:
        """Close every descriptor received and not claimed."""
        for _, fds in self.take_through(self.received):
            _close_all(fds)

    def sendall(self, data: bytes | memoryview, /) -> Any:
        return self.sock.sendall(data)

    def fileno(self) -> int:
        return self.sock.fileno()

    def shutdown(self, how: int, /) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.discard()
        self.sock.close()


def reader_for(sock: socket.socket) -> socket.socket | DescriptorReader:
    """What the agent reads ``sock`` through: a ``DescriptorReader`` on a Unix socket (so
    that descriptors are never dropped unseen, before the token or after), else ``sock``."""
    return DescriptorReader(sock) if sock.family == socket.AF_UNIX else sock


def holds(stream: Any) -> bool:
    """Whether descriptors came on ``stream`` and wait, unclaimed."""
    reader = reader_of(stream)
    return reader is not None and reader.holds_any()


def discard(stream: Any) -> None:
    """Close every descriptor that came on ``stream`` and was not claimed."""
    reader = reader_of(stream)
    if reader is not None:
        reader.discard()


def reader_of(stream: Any) -> DescriptorReader | None:
    """The ``DescriptorReader`` under ``stream`` (itself, or a ``ReadAhead``'s socket)."""
    for candidate in (stream, getattr(stream, "sock", None)):
        if isinstance(candidate, DescriptorReader):
            return candidate
    return None


def position(stream: Any, reader: DescriptorReader | None) -> int:
    """How many bytes of ``stream`` (``reader``, or a ``ReadAhead`` over it: ``reader_of``)
    the frame parser has consumed (0 without a reader)."""
    if reader is None:
        return 0
    return reader.received - (0 if stream is reader else stream.unread())


def described(sizes: list[int]) -> bool:
    """Whether a size table says any buffer comes as a descriptor, or is lent (pure)."""
    return any(size & _FLAGS for size in sizes)


def claim(reader: DescriptorReader | None, stream: Any, start: int, sizes: list[int],
          wrap: Callable[[int, int], Any]) -> list[Any] | None:
    """For the frame whose head was read from ``start`` up to here, with size table ``sizes``,
    from ``stream`` over ``reader`` (``reader_of``): each buffer that comes as a descriptor,
    checked and given to ``wrap(fd, size, lent)`` (which owns the descriptor from then on:
    ``relay.Arriving.of_memfd``), None for each whose bytes follow; None instead of the list
    when no buffer comes as a descriptor. ``ProtocolError`` (every descriptor taken closed)
    for descriptors out of place, missing or too many, or one that is not a sealed memfd of
    its size."""
    if (reader is None or not reader._batches) and not (sizes and described(sizes)):
        # Most frames: none came, none is declared. (``_batches`` grows only in the reading
        # thread, which is this one.)
        return None
    wanted = [size & ~_FLAGS for size in sizes if size & DESCRIPTOR]
    if reader is None:
        raise protocol.ProtocolError("descriptors declared on a connection without them")
    if any(size & _FLAGS == LENT for size in sizes):  # (the connection's close discards all)
        raise protocol.ProtocolError("a buffer said to be lent does not come as a descriptor")
    batches = reader.take_through(position(stream, reader))
    fds = [fd for _, batch in batches for fd in batch]
    try:
        if any(end <= start for end, _ in batches):
            raise protocol.ProtocolError("descriptors sent outside a frame's head")
        if len(fds) != len(wanted) or len(wanted) > MAX_DESCRIPTORS:
            raise protocol.ProtocolError(
                f"a frame declares {len(wanted)} descriptors and came with {len(fds)}")
        for fd, size in zip(fds, wanted, strict=True):
            check(fd, size)
    except BaseException:
        _close_all(fds)
        raise
    if not wanted:
        return None  # those that wait came with a later frame's bytes (read ahead)
    handed: list[Any] = []
    try:
        lent = [bool(size & LENT) for size in sizes if size & DESCRIPTOR]
        for at, (fd, size) in enumerate(zip(fds, wanted, strict=True)):
            handed.append(wrap(fd, size, lent[at]))
    except BaseException:
        _close_all(fds[at + 1:])
        raise
    each = iter(handed)
    return [next(each) if size & DESCRIPTOR else None for size in sizes]


def check(fd: int, size: int) -> None:
    """``ProtocolError`` unless ``fd`` is a memfd of at least ``size`` bytes sealed against
    writing and shrinking (so what the agent and its workers map can neither vanish nor, but
    for a lent one between tasks, change)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise protocol.ProtocolError("a handed-over buffer is not a memfd")
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise protocol.ProtocolError("a handed-over buffer is not a sealable memfd") from exc
    if not seals & _NO_WRITE or not seals & fcntl.F_SEAL_SHRINK:
        raise protocol.ProtocolError("a handed-over memfd is not sealed against writes")
    if info.st_size < size or size < DESCRIPTOR_MIN:
        raise protocol.ProtocolError(
            f"a handed-over memfd holds {info.st_size} bytes, its frame says {size}")


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
