"""Cut-through relay: the agent forwards a task's out-of-band buffers to its worker as they
arrive from the client, instead of holding the whole frame first.

Store-and-forward made the two hops (client -> agent, agent -> worker) add up: a 100 MB argument
reached the worker only after the agent held all of it (bench/wire_stages.py: relay 118 MB/s
against one hop's 250). Here the agent reads a frame up to its buffers (header, payload, size
table: checked as ``protocol.read_frame_head`` checks them), maps each buffer lazily as an
``Arriving``, and rebuilds the frame's messages around them at once; the tasks are placed while
the bytes are still coming, and a send of an ``Arriving`` (``protocol.send``) writes each
piece as soon as it is there.

The wire is unchanged, and so are its limits: this runs only on an authenticated connection,
what the peer can make the agent allocate is still what it sends (the mappings are lazy), and at
most ``MAX_RELAYED_BUFFERS`` buffers of a frame are relayed this way (more fall back to reading
the whole frame first, one mapping at a time).

The other way, a worker's small frames (results, output, ``Started``) are passed on to their
client as received (``receive_passable``, ``deliver``) when all of a frame's messages go to
that one client: the agent unpickles them for its bookkeeping but does not pickle them again.
Likewise a client's small frame of tasks goes to a worker as received when the worker takes
all of them at once (``frame_of``).

On a Local node's Unix socket a large buffer need not arrive at all: the client hands over a
sealed memfd instead (node/fd_buffers.py), which becomes an ``Arriving`` that has all arrived
(``Arriving.of_memfd``), and its workers are given that very memfd.

If the client goes away mid-frame, every ``Arriving`` of the frame is *lost*: a send waiting on
one raises ``SourceLost``, and a task holding one is never run (``lost``, node/slots.py).
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import pickle
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Self

from skyward_iac.node import fd_buffers, protocol, read_ahead

log = logging.getLogger("skyward.agent")
#: The frame ``serve`` is dispatching in this thread: ``(messages, passable frame or None)``.
_dispatching = threading.local()

#: Frames whose buffers add up to at least this are relayed as they arrive.
CUT_THROUGH_MIN = protocol.LAZY_MIN
#: More buffers than this in one frame: read the frame whole first (each is one mapping).
MAX_RELAYED_BUFFERS = 64
#: A forwarding send waits for this many new bytes (or the buffer's end) before it writes:
#: fewer, larger writes to the worker.
FORWARD_STEP = 1 << 20
#: An arriving buffer is read this much at a time, then written to its memfd.
FILL_PIECE = 1 << 20
#: Arriving buffers at least this large go into a memfd a worker maps (one descriptor each).
MAPPED_MIN = protocol.LAZY_MIN
#: Seals of a buffer that has arrived (``Arriving.memfd``); ``F_SEAL_FUTURE_WRITE`` (Linux
#: 5.1) is not named by Python 3.11's fcntl.
ARRIVED_SEALS = (fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
                 | getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010))


class SourceLost(OSError):
    """A buffer being forwarded will never be complete: its sender left mid-frame. The frame
    being written with it is broken, so the stream it was written to is too."""


class Arriving(mmap.mmap):
    """A received out-of-band buffer that may still be filling, and how many of its bytes have
    arrived. From ``MAPPED_MIN`` bytes on it is a memfd (pages allocated as bytes arrive),
    mapped shared and read-only here, so that once complete a worker maps the very same pages
    (``memfd``, node/buffer_maps.py) instead of being sent a copy of the bytes; a smaller one
    is lazily mapped anonymous memory, sent as bytes (a descriptor apiece would cost more)."""

    arrived: int
    lost: bool
    #: Whether its client lends the memfd (node/fd_buffers.py): a worker keeps its mapping.
    lent: bool
    #: The memfd (None: anonymous memory).
    fd: int | None
    _changed: threading.Condition
    _wanted: int
    _sealed: bool

    def __new__(cls, size: int) -> Self:
        if size < MAPPED_MIN:
            self = super().__new__(cls, -1, size, flags=mmap.MAP_PRIVATE)
            self.fd = None
        else:
            fd = os.memfd_create("skyward-arg", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            try:
                os.ftruncate(fd, size)
                # Read-only: the bytes are written to the file (``fill_from``), not through it.
                self = super().__new__(cls, fd, size, flags=mmap.MAP_SHARED,
                                       prot=mmap.PROT_READ)
            except BaseException:
                os.close(fd)
                raise
            self.fd = fd
            weakref.finalize(self, os.close, fd)
        self.arrived = 0
        self.lost = False
        self.lent = False
        self._changed = threading.Condition()
        self._wanted = 0  # how many bytes its forwarding send waits for
        self._sealed = False
        return self

    @classmethod
    def of_memfd(cls, fd: int, size: int, lent: bool = False) -> Self:
        """One that came whole as ``fd``, a memfd its sender sealed (node/fd_buffers.py,
        checked there; ``lent``: one its client will write again once the task let go of it),
        owned from now on: its workers are handed this same memfd."""
        try:
            # Private: a shared mapping of a write-sealed memfd is refused before Linux 6.7.
            self = mmap.mmap.__new__(cls, fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.arrived, self.lost, self._wanted, self._sealed = fd, size, False, 0, True
        self.lent = lent
        self._changed = threading.Condition()
        weakref.finalize(self, os.close, fd)
        return self

    def memfd(self) -> int:
        """Its memfd once every byte has arrived (``SourceLost`` if they never will), sealed:
        nobody can write to it, grow or shrink it any more. (``F_SEAL_FUTURE_WRITE``:
        ``F_SEAL_WRITE`` would refuse while this object's own shared mapping exists, which is
        read-only.) ``ValueError`` for one in anonymous memory."""
        if self.fd is None:
            raise ValueError("a buffer smaller than MAPPED_MIN arrives in anonymous memory")
        size = len(self)
        self._wait_for(size, size)
        with self._changed:
            if not self._sealed:
                fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, ARRIVED_SEALS)
                self._sealed = True
        return self.fd

    def fill_from(self, stream: protocol.ByteStream) -> None:
        if self.fd is None:
            protocol.fill(stream, self, self._advance)
        else:
            _fill_file(stream, self.fd, len(self), self._advance)

    def _advance(self, arrived: int) -> None:
        with self._changed:
            self.arrived = arrived
            # Woken only once what it waits for is there: a wake-up per read (sshd writes
            # 32 KiB at a time) would have the two threads trade the GIL thousands of times.
            if arrived >= self._wanted:
                self._changed.notify_all()

    def abandon(self) -> None:
        """It will never be complete (its sender is gone)."""
        with self._changed:
            self.lost = self.arrived < len(self)
            self._changed.notify_all()

    def forward_arriving(self, stream: protocol.ByteStream, view: memoryview) -> None:
        """Write ``view`` (this buffer, or part of it) to ``stream`` as its bytes arrive;
        ``SourceLost`` if they never will."""
        size = len(self)
        if view.nbytes != size:  # a part: send it once all is there
            self._wait_for(size, size)
            stream.sendall(view)
            return
        sent = 0
        while sent < size:
            upto = self._wait_for(min(sent + FORWARD_STEP, size), size)
            stream.sendall(view[sent:upto])
            sent = upto

    def _wait_for(self, wanted: int, size: int) -> int:
        with self._changed:
            self._wanted = wanted
            while self.arrived < wanted and not self.lost:
                self._changed.wait()
            if self.arrived < wanted:
                raise SourceLost(f"a {size}-byte buffer stopped after {self.arrived} bytes")
            return self.arrived


def _fill_file(stream: protocol.ByteStream, fd: int, size: int,
              progress: Callable[[int], None] | None = None) -> None:
    """Read ``size`` bytes from ``stream`` into the file ``fd`` from its start, ``FILL_PIECE``
    at a time through one buffer, telling ``progress`` how many are there after each;
    ``protocol.ConnectionClosed`` if the stream ends first. ``pwrite`` allocates a memfd's
    pages as it fills them, unzeroed and in bulk: written through a mapping, each 4 KiB page
    would be faulted in and zeroed first (most of what receiving 100 MB cost on a node)."""
    piece = memoryview(bytearray(min(size, FILL_PIECE)))
    written = 0
    while written < size:
        want = min(len(piece), size - written)
        protocol.fill(stream, piece[:want])  # type: ignore[arg-type]
        done = 0
        while done < want:
            done += os.pwrite(fd, piece[done:want], written + done)
        written += want
        if progress is not None:
            progress(written)


def receive(channel: protocol.Channel) -> tuple[tuple[Any, ...], Callable[[], None] | None]:
    """The messages of the next frame (as ``Channel.receive``) and, when its buffers are
    relayed as they arrive, the function that reads them (``None`` when all was read).

    The caller must call that function before reading the next frame, and may hand the
    messages on meanwhile."""
    messages, rest, _ = _receive(channel, fd_buffers.reader_of(channel.stream))
    return messages, rest


def _receive(channel: protocol.Channel, reader: fd_buffers.DescriptorReader | None
             ) -> tuple[tuple[Any, ...], Callable[[], None] | None, list[bytes] | None]:
    """As ``receive`` (``reader``: ``fd_buffers.reader_of(channel.stream)``), and the frame as
    received when it can be passed on as it is."""
    stream = channel.stream
    start = fd_buffers.position(stream, reader)
    kind, payload, sizes = read_ahead.read_frame_head(stream)
    if kind == protocol.RAW:
        raise protocol.ProtocolError("unexpected raw frame after the handshake")
    handed = fd_buffers.claim(reader, stream, start, sizes, Arriving.of_memfd)
    if handed is not None:  # no byte of theirs follows
        buffers = [buffer if buffer is not None else protocol.recv_buffer(stream, size)
                   for buffer, size in zip(handed, sizes, strict=True)]
        return protocol.unbatch(pickle.loads(payload, buffers=buffers)), None, None
    if not sizes:  # the usual small frame (tasks, a cancel): nothing follows its head
        return protocol.unbatch(pickle.loads(payload)), None, _passable(kind, payload)
    if not relayed(sizes):
        buffers = [protocol.recv_buffer(stream, size) for size in sizes]
        return protocol.unbatch(pickle.loads(payload, buffers=buffers)), None, None
    arriving = [Arriving(size) for size in sizes]
    messages = protocol.unbatch(pickle.loads(payload, buffers=arriving))

    def read_buffers() -> None:
        try:
            for buffer in arriving:
                buffer.fill_from(channel.stream)
        finally:
            for buffer in arriving:
                buffer.abandon()  # lost unless complete: nobody waits on it forever

    return messages, read_buffers, None


def _passable(kind: int, payload: Any) -> list[bytes] | None:
    """A frame without buffers as received, if it can be sent on as it is (no lz4), else
    None."""
    if kind != protocol.PICKLED:
        return None
    return [protocol.HEADER.pack(len(payload), protocol.PICKLED), payload]


def receive_passable(channel: protocol.Channel) -> tuple[tuple[Any, ...], list[bytes] | None]:
    """The messages of the next frame (as ``Channel.receive``) and, for a frame without
    out-of-band buffers or compression, the frame itself, to be passed on unchanged: a
    worker's results go to their client without being pickled again."""
    kind, payload, sizes = read_ahead.read_frame_head(channel.stream)
    if kind == protocol.RAW:
        raise protocol.ProtocolError("unexpected raw frame after the handshake")
    if not sizes:  # a result, output: the usual frame
        return protocol.unbatch(pickle.loads(payload)), _passable(kind, payload)
    buffers = [protocol.recv_buffer(channel.stream, size) for size in sizes]
    return protocol.unbatch(pickle.loads(payload, buffers=buffers)), None


def one_route(deliveries: Sequence[tuple[Any, Any]], received: int) -> bool:
    """Whether all ``received`` messages of a frame go to one route (pure policy)."""
    if len(deliveries) != received or not received:
        return False
    first = deliveries[0][0]
    for route, _ in deliveries:
        if route is not first:
            return False
    return True


def deliver(deliveries: Sequence[tuple[Any, Any]], frame: list[bytes] | None = None,
            received: int = 0) -> None:
    """Send each route (a ``protocol.Channel``) its messages, in order, in one frame per
    route. ``frame``: the frame of ``received`` messages they came in (``receive_passable``),
    passed on as it is when all of them go to one route: the agent pickles nothing again."""
    send_frames = getattr(deliveries[0][0], "send_frames", None) if deliveries else None
    if frame is not None and send_frames is not None and one_route(deliveries, received):
        try:
            send_frames(frame)
        except OSError:
            log.info("client gone; dropped %d message(s)", received)
        return
    by_route: dict[int, tuple[Any, list[Any]]] = {}
    for route, message in deliveries:
        by_route.setdefault(id(route), (route, []))[1].append(message)
    for route, messages in by_route.values():
        try:
            route.send_many(messages)
        except OSError:
            log.info("client gone; dropped %d message(s)", len(messages))


def relayed(sizes: Sequence[int]) -> bool:
    """Whether a frame with buffers of these sizes is relayed as it arrives (pure policy)."""
    return (0 < len(sizes) <= MAX_RELAYED_BUFFERS and min(sizes) > 0
            and sum(sizes) >= CUT_THROUGH_MIN)


def lost(buffers: Sequence[Any]) -> bool:
    """Whether any of a task's buffers will never be complete (an ``Arriving``, or a buffer
    kept from one, node/buffer_maps.py)."""
    return any(getattr(buffer, "lost", False) is True for buffer in buffers)


def serve(channel: protocol.Channel, dispatch: Callable[[Sequence[Any]], None]) -> None:
    """Read frames from ``channel`` until it ends, handing each frame's messages to
    ``dispatch`` in order; a relayed frame's messages are dispatched (in a thread of their
    own) while its buffers are still arriving."""
    reader = fd_buffers.reader_of(channel.stream)  # once, not for every frame
    while True:
        messages, rest, frame = _receive(channel, reader)
        if rest is None:
            _dispatching.frame = (messages, frame)  # for ``frame_of``, while dispatched
            try:
                dispatch(messages)
            finally:
                _dispatching.frame = None
            continue
        _dispatch_while_reading(messages, rest, dispatch)


def frame_of(tasks: Sequence[Any]) -> list[bytes] | None:
    """The frame ``serve`` is dispatching in this thread, if it holds exactly ``tasks`` and
    can be passed on as it is: the agent then sends it to a worker without pickling it again."""
    messages, frame = getattr(_dispatching, "frame", None) or ((), None)
    return frame if frame is not None and same_objects(messages, tasks) else None


def same_objects(these: Sequence[Any], those: Sequence[Any]) -> bool:
    """Whether two sequences hold the very same objects in the same order (pure)."""
    if len(these) != len(those):
        return False
    for a, b in zip(these, those):  # a loop, not all(generator): this runs for every task
        if a is not b:
            return False
    return True


def _dispatch_while_reading(messages: Sequence[Any], rest: Callable[[], None],
                            dispatch: Callable[[Sequence[Any]], None]) -> None:
    """``dispatch(messages)`` in a thread while ``rest()`` reads their buffers here; returns
    when both are done, raising what either raised."""
    failed: list[BaseException] = []

    def dispatch_now() -> None:
        try:
            dispatch(messages)
        except BaseException as exc:  # noqa: BLE001 - raised in the reading thread below
            failed.append(exc)

    dispatcher = threading.Thread(target=dispatch_now, daemon=True, name="relay-dispatch")
    dispatcher.start()
    try:
        rest()
    finally:
        dispatcher.join()  # the next frame's messages come after these
    if failed:
        raise failed[0]
