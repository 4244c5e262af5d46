"""Reading a socket ahead of the frame parser: a small frame's header and payload in one read.

``protocol.read_frame_head`` asks for a frame's 5-byte header, then for its payload: two
``recv`` calls (two system calls on a plain socket, two trips into OpenSSL on a TLS one) for
every task and result that crosses the agent. ``ReadAhead`` reads up to ``CHUNK`` bytes at a
time and serves the parser from them, so a small frame costs one read; a large read (an
out-of-band buffer, ``recv_into``) goes straight into its destination once what was read ahead
is used up, so bulk data is not copied once more.

Only wrapped around a connection after its peer proved it holds the token: before that the
agent reads nothing beyond the token frame (``agent.authenticate``).
"""

from __future__ import annotations

import pickle
import socket
from typing import Any

from skyward_iac.node import protocol

#: Bytes asked of the socket by one read when the caller wants less.
CHUNK = 65536


def close_socket(sock: Any) -> None:
    """Shut ``sock`` down, then close it: close() alone would leave a recv blocked in another
    thread (and the connection) open."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def read_frame_head(stream: protocol.ByteStream) -> protocol.FrameHead:
    """``protocol.read_frame_head``; a plain pickled frame (no buffers, no lz4) that a
    ``ReadAhead`` holds whole is taken from it at once, without the general parser's steps."""
    if isinstance(stream, ReadAhead):
        payload = stream.small_frame()
        if payload is not None:
            return protocol.PICKLED, payload, []
    return protocol.read_frame_head(stream)


def receive(stream: protocol.ByteStream) -> tuple[Any, ...]:
    """The messages of the next frame on ``stream``, as ``protocol.Channel.receive``."""
    if isinstance(stream, ReadAhead):
        payload = stream.small_frame()
        if payload is not None:  # plain pickled, held whole: a task's usual frame
            return protocol.unbatch(pickle.loads(payload))
    kind, payload, sizes = read_frame_head(stream)
    buffers = [protocol.recv_buffer(stream, size) for size in sizes]
    return protocol.unbatch(protocol.message_of(kind, payload, buffers))


class ReadAhead:
    """A ``protocol.ByteStream`` reading ``sock`` (a socket, or a ``fd_buffers.DescriptorReader``
    of one) through a buffer; writes go to the socket itself (give it to ``protocol.Channel``
    as its writer)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self._held = b""  # read from the socket, not yet given out
        self._at = 0

    def unread(self) -> int:
        """How many bytes read from the socket are held here, not yet given out."""
        return len(self._held) - self._at

    def pending(self) -> bool:
        """Whether bytes are held here (a ``select`` on the socket does not see them)."""
        return self._at < len(self._held)

    def small_frame(self) -> bytes | None:
        """The payload of the next frame if it is plain pickled (flags exactly ``PICKLED``:
        no buffers, no lz4) and held here whole (reading once if nothing is held); else None,
        having consumed nothing, for ``protocol.read_frame_head`` to parse it."""
        if self._at == len(self._held):
            data = self.sock.recv(CHUNK)
            if not data:
                return None  # the parser's own read sees the end and says so
            self._held, self._at = data, 0
        held, at = self._held, self._at
        if len(held) - at < protocol.HEADER.size:
            return None
        size, flags = protocol.HEADER.unpack_from(held, at)
        end = at + protocol.HEADER.size + size
        if flags != protocol.PICKLED or end > len(held):
            return None
        self._at = end
        return held[at + protocol.HEADER.size:end]

    def recv(self, size: int, /) -> bytes:
        if self._at < len(self._held):
            start, self._at = self._at, min(self._at + size, len(self._held))
            if start == 0 and self._at == len(self._held):
                return self._held  # the whole read: no copy
            return self._held[start:self._at]
        if size >= CHUNK:
            return self.sock.recv(size)
        data = self.sock.recv(CHUNK)
        if len(data) <= size:
            return data
        self._held, self._at = data, size
        return data[:size]

    def recv_into(self, buffer: Any, nbytes: int = 0, /) -> int:
        wanted = nbytes or len(buffer)
        if self._at < len(self._held):
            got = min(wanted, len(self._held) - self._at)
            buffer[:got] = self._held[self._at:self._at + got]
            self._at += got
            return got
        return self.sock.recv_into(buffer, wanted)

    def sendall(self, data: bytes | memoryview, /) -> Any:
        return self.sock.sendall(data)

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        close_socket(self.sock)
