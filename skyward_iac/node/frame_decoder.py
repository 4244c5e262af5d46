"""Frames from bytes as they arrive, for a reader that must never block (the client's wire loop).

``protocol.read_frame_head`` pulls a frame from a blocking stream; ``FrameDecoder`` is pushed
bytes instead and drives the same parser (``protocol.frame_steps``: the same size, flag, lz4
and buffer-count checks) plus the out-of-band buffers after it. Pieces up to
``protocol.PIECE_MAX`` are gathered in a small staging area; a larger one (a big payload, every
out-of-band buffer) gets its own ``protocol.new_buffer`` (lazily mapped from
``protocol.LAZY_MIN``, so memory follows the bytes received) and the caller reads straight into
it: a 100 MB result is written once by the kernel, as with the blocking reader, apart from the
few bytes that arrived in the same read as its header. A plain frame that arrives whole between
frames (a result, a batch of them: the round trip's case) is taken from the read at once, as
``read_ahead.ReadAhead.small_frame`` does on the node.

Use: ``view = decoder.buffer()``, read at most ``len(view)`` bytes into it, then
``decoder.filled(n)`` returns the frames completed, each ``(kind, payload, buffers)`` for
``protocol.message_of``. A malformed frame raises ``protocol.ProtocolError``.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from skyward_iac.node import protocol

Frame = tuple[int, Any, list[Any]]
#: The staging reads' size: small frames of a batch are read many to a syscall.
SCRATCH = 1 << 16
#: At most this much is read into a large piece at once (the wire loop serves others between).
DIRECT_CHUNK = 1 << 20


class FrameDecoder:
    """Incremental frame reader of one connection (see the module doc); one thread uses it."""

    def __init__(self, scratch: bytearray | None = None) -> None:
        #: Where small reads land before they are staged: shareable by every decoder that one
        #: thread drives (the wire loop's), since ``filled`` moves the bytes out at once.
        self._scratch = scratch if scratch is not None else bytearray(SCRATCH)
        self._scratch_view = memoryview(self._scratch)
        self._staged = bytearray()
        self._frames: list[Frame] = []
        #: The piece being read straight into (a large payload or an out-of-band buffer).
        self._target: Any = None
        self._got = 0
        self._view: memoryview | None = None
        self._head = True
        #: No byte of the next frame taken yet (all of them, if any, are staged).
        self._between = True
        self._steps: Generator[int, Any, protocol.FrameHead] = protocol.frame_steps()
        self._need = next(self._steps)
        self._kind, self._payload = protocol.RAW, b""
        self._sizes: list[int] = []
        self._buffers: list[Any] = []

    @property
    def mid_frame(self) -> bool:
        """Whether part of a frame has arrived and not the rest."""
        return bool(self._staged) or not self._between

    def buffer(self) -> memoryview:
        """Where the next bytes go (at most ``len()`` of them), until ``filled`` is called."""
        if self._target is None:
            return self._scratch_view
        self._view = memoryview(self._target)[self._got:self._got + DIRECT_CHUNK]
        return self._view

    def filled(self, count: int) -> list[Frame]:
        """``count`` bytes were written into ``buffer()``: the frames they completed."""
        if self._view is not None:
            self._view.release()  # an mmap with an exported view cannot be freed
            self._view = None
        if not count:
            return []
        if self._between and not self._staged:
            # Between frames: the whole plain frames at the head of the read (a result, a
            # batch of them) are taken from it at once, without the parser's steps.
            at = self._whole_frames(count)
            if at == count:
                frames, self._frames = self._frames, []
                return frames
            self._staged += self._scratch_view[at:count]
        elif self._target is not None:
            self._got += count
            if self._got == len(self._target):
                piece, self._target = self._target, None
                self._advance(piece)
        else:
            self._staged += self._scratch_view[:count]
        while self._target is None and self._take_staged():
            pass
        frames, self._frames = self._frames, []
        return frames

    def _whole_frames(self, count: int) -> int:
        """Take the plain pickled frames (flags exactly ``PICKLED``: no buffers, no lz4) that
        the first ``count`` bytes of the scratch hold whole; where the rest starts. The size
        needs no limit here: the bytes are all in the scratch already, nothing is allocated
        for what a header announces."""
        scratch, at, frames = self._scratch, 0, self._frames
        header, size_of_header = protocol.HEADER, protocol.HEADER.size
        while count - at >= size_of_header:
            size, flags = header.unpack_from(scratch, at)
            start = at + size_of_header
            if flags != protocol.PICKLED or start + size > count:
                break
            frames.append((protocol.PICKLED, scratch[start:start + size], []))
            at = start + size
        return at

    def _take_staged(self) -> bool:
        """Move the next piece out of the staging area; False when it needs more bytes."""
        need, staged = self._need, self._staged
        if need > protocol.PIECE_MAX or not self._head:
            target = protocol.new_buffer(need)
            take = min(need, len(staged))
            if take:
                target[:take] = staged[:take]
                del staged[:take]
            if take == need:
                self._advance(target)
                return True
            self._target, self._got = target, take
            return False
        if len(staged) < need:
            return False
        piece = bytes(staged[:need])
        del staged[:need]  # cheap: a bytearray drops its head without moving the rest
        self._advance(piece)
        return True

    def _advance(self, piece: Any) -> None:
        """``piece`` is the next thing the frame needed: move to what it needs after it."""
        if self._head:
            self._between = False
            try:
                self._need = self._steps.send(piece)
                return
            except StopIteration as done:
                self._kind, self._payload, self._sizes = done.value
            self._head, self._buffers = False, []
        else:
            self._buffers.append(piece)
        if len(self._buffers) < len(self._sizes):
            self._need = self._sizes[len(self._buffers)]
            return
        self._frames.append((self._kind, self._payload, self._buffers))
        self._head, self._between, self._steps = True, True, protocol.frame_steps()
        self._need = next(self._steps)
