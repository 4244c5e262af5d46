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

If the client goes away mid-frame, every ``Arriving`` of the frame is *lost*: a send waiting on
one raises ``SourceLost``, and a task holding one is never run (``lost``, node/slots.py).
"""

from __future__ import annotations

import mmap
import pickle
import threading
from collections.abc import Callable, Sequence
from typing import Any, Self

from skyward_iac.node import protocol

#: Frames whose buffers add up to at least this are relayed as they arrive.
CUT_THROUGH_MIN = protocol.LAZY_MIN
#: More buffers than this in one frame: read the frame whole first (each is one mapping).
MAX_RELAYED_BUFFERS = 64
#: A forwarding send waits for this many new bytes (or the buffer's end) before it writes:
#: fewer, larger writes to the worker.
FORWARD_STEP = 1 << 20


class SourceLost(OSError):
    """A buffer being forwarded will never be complete: its sender left mid-frame. The frame
    being written with it is broken, so the stream it was written to is too."""


class Arriving(mmap.mmap):
    """A received out-of-band buffer that may still be filling: lazily mapped anonymous
    memory and how many of its bytes have arrived."""

    arrived: int
    lost: bool
    _changed: threading.Condition
    _wanted: int

    def __new__(cls, size: int) -> Self:
        self = super().__new__(cls, -1, size, flags=mmap.MAP_PRIVATE)
        self.arrived = 0
        self.lost = False
        self._changed = threading.Condition()
        self._wanted = 0  # how many bytes its forwarding send waits for
        return self

    def fill_from(self, stream: protocol.ByteStream) -> None:
        protocol.fill(stream, self, self._advance)

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


def receive(channel: protocol.Channel) -> tuple[tuple[Any, ...], Callable[[], None] | None]:
    """The messages of the next frame (as ``Channel.receive``) and, when its buffers are
    relayed as they arrive, the function that reads them (``None`` when all was read).

    The caller must call that function before reading the next frame, and may hand the
    messages on meanwhile."""
    kind, payload, sizes = protocol.read_frame_head(channel.stream)
    if kind == protocol.RAW:
        raise protocol.ProtocolError("unexpected raw frame after the handshake")
    if not relayed(sizes):
        buffers = [protocol.recv_buffer(channel.stream, size) for size in sizes]
        return protocol.unbatch(pickle.loads(payload, buffers=buffers)), None
    arriving = [Arriving(size) for size in sizes]
    messages = protocol.unbatch(pickle.loads(payload, buffers=arriving))

    def read_buffers() -> None:
        try:
            for buffer in arriving:
                buffer.fill_from(channel.stream)
        finally:
            for buffer in arriving:
                buffer.abandon()  # lost unless complete: nobody waits on it forever

    return messages, read_buffers


def relayed(sizes: Sequence[int]) -> bool:
    """Whether a frame with buffers of these sizes is relayed as it arrives (pure policy)."""
    return (0 < len(sizes) <= MAX_RELAYED_BUFFERS and min(sizes) > 0
            and sum(sizes) >= CUT_THROUGH_MIN)


def lost(buffers: Sequence[Any]) -> bool:
    """Whether any of a task's buffers will never be complete."""
    return any(isinstance(buffer, Arriving) and buffer.lost for buffer in buffers)


def serve(channel: protocol.Channel, dispatch: Callable[[Sequence[Any]], None]) -> None:
    """Read frames from ``channel`` until it ends, handing each frame's messages to
    ``dispatch`` in order; a relayed frame's messages are dispatched (in a thread of their
    own) while its buffers are still arriving."""
    while True:
        messages, rest = receive(channel)
        if rest is None:
            dispatch(messages)
            continue
        _dispatch_while_reading(messages, rest, dispatch)


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
