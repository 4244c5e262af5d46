"""The wire protocol between the client and a node's agent (and between an agent and its workers).

A frame is a 5-byte header (payload length, flags) and a payload. The first frame of a
connection is RAW: the per-stack token, at most ``MAX_TOKEN_FRAME`` bytes, checked before the
agent reads anything else (a longer or non-raw first frame is refused unread). Every later
payload is a pickled message, lz4-compressed when that makes it meaningfully smaller.
``Channel`` is the one way agent, worker and client read and write frames; the messages
themselves are in node/messages.py. User code and values travel as nested pickles
(``Task.payload``, ``Result.value``), so a failure to rebuild them is reported per task instead
of breaking the connection.

Two things keep the hot paths cheap:

- ``Batch``: many messages in one frame (tasks the client had queued for one node, results a
  worker finished together), so a frame's fixed costs (syscalls, SSH packets, thread wake-ups)
  are paid once per batch rather than once per task.
- Out-of-band buffers (pickle protocol 5): large contiguous buffers of a call or a result (numpy
  arrays, ...) travel after the payload as raw bytes (the BUFFERS flag), never copied into a
  pickle, never lz4-compressed, and never re-pickled by the agent that forwards them.
"""

from __future__ import annotations

import mmap
import pickle
import socket
import struct
import threading
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

import cloudpickle
import lz4.frame

from skyward_iac.node.messages import Batch

HEADER = struct.Struct("!IB")
RAW, PICKLED, COMPRESSED = 0, 1, 2
#: Flag bit: out-of-band buffers follow the payload (a count, their sizes, then their bytes).
BUFFERS = 0x10
_KIND = 0x0F
COUNT = struct.Struct("!I")
SIZE = struct.Struct("!Q")
COMPRESS_MIN = 4096
#: lz4 must shrink this much of a large payload's head to be tried on the whole payload.
COMPRESS_SAMPLE = 65536
#: Buffers at least this large travel out of band; smaller ones are cheaper inside the pickle.
OUT_OF_BAND_MIN = 65536
MAX_FRAME = 2**32 - 1
#: The wire's version, sent in ``Welcome``: a client refuses an agent speaking another one. 1: before
#: ``Welcome`` had it; 2: lz4 sizes; 3: shared arguments; 4: lent memfds (``Result.let_go``).
PROTOCOL_VERSION = 4
#: The first frame (the token) must be RAW and at most this long: nothing larger is read
#: from a peer that has not proved it holds the token.
MAX_TOKEN_FRAME = 4096
#: At most this many out-of-band buffers in one frame.
MAX_BUFFERS = 1 << 16
#: lz4 shrinks data at most about 255 times: a compressed payload declaring a larger size is
#: refused before anything is decompressed.
LZ4_MAX_RATIO = 256
#: Received payloads and buffers at least this large are mapped lazily (anonymous memory the kernel
#: supplies as bytes arrive), so memory follows the bytes received, not the size announced.
LAZY_MIN = 1 << 20
#: Payloads up to this size are joined with their header into one write; a read of more goes
#: straight into a buffer of its own (``new_buffer``).
PIECE_MAX = 65536
_JOIN_MAX = PIECE_MAX
_RECV_CHUNK = 1 << 20


class ByteStream(Protocol):
    """A socket or an SSH channel."""

    def sendall(self, data: bytes | memoryview, /) -> Any: ...
    def recv(self, size: int, /) -> bytes: ...


class ConnectionClosed(EOFError):
    """The peer closed the connection."""


class ProtocolError(ValueError):
    """The peer broke the protocol (a frame malformed, oversized or out of place): the
    connection cannot go on."""


def dumps(obj: Any) -> bytes:
    """cloudpickle with protocol 5 (user values: functions, arguments, results)."""
    return cloudpickle.dumps(obj, protocol=5)


def dumps_with_buffers(obj: Any, copy: bool = False) -> tuple[bytes, tuple[Any, ...]]:
    """cloudpickle ``obj``, keeping its large contiguous buffers out of the pickle.

    ``copy=True`` snapshots each buffer (one copy, as pickling in band would make), so the
    caller may mutate ``obj`` before the bytes are sent; otherwise the buffers are views.
    """
    buffers: list[Any] = []

    def keep_out(buffer: pickle.PickleBuffer) -> bool:
        try:
            raw = buffer.raw()
        except BufferError:  # not contiguous: pickle it in band
            return True
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True
        buffers.append(bytearray(raw) if copy else raw)
        return False

    payload = cloudpickle.dumps(obj, protocol=5, buffer_callback=keep_out)
    return payload, tuple(buffers)


def loads(payload: bytes, buffers: Sequence[Any] = ()) -> Any:
    """Unpickle a user value produced by ``dumps`` or ``dumps_with_buffers``."""
    return pickle.loads(payload, buffers=buffers)


def encode(obj: Any) -> list[Any]:
    """Frame a message: header, payload (compressed only when it pays) and any out-of-band
    buffers of its tasks or results."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    flags = PICKLED
    if len(payload) >= COMPRESS_MIN and _worth_compressing(payload):
        packed = lz4.frame.compress(payload)  # stores the content size, which readers require
        if len(packed) < len(payload) * 0.9:
            payload, flags = packed, COMPRESSED
    frames = _framed(payload, flags | (BUFFERS if buffers else 0))
    if buffers:
        views = [b.raw() for b in buffers]
        frames.append(COUNT.pack(len(views)) + b"".join(SIZE.pack(v.nbytes) for v in views))
        frames.extend(views)
    return frames


def _worth_compressing(payload: bytes) -> bool:
    """Large payloads must compress well at their head first: lz4 on 100 MB of noise costs a
    tenth of a second for nothing."""
    if len(payload) <= 2 * COMPRESS_SAMPLE:
        return True
    head = payload[:COMPRESS_SAMPLE]
    return len(lz4.frame.compress(head)) < len(head) * 0.9


def encode_raw(data: bytes) -> list[Any]:
    """Frame raw bytes (the handshake token)."""
    return _framed(data, RAW)


def _framed(payload: bytes, flags: int) -> list[Any]:
    if len(payload) > MAX_FRAME:
        raise ValueError(f"message of {len(payload)} bytes exceeds the 4 GiB frame limit")
    return [HEADER.pack(len(payload), flags), payload]


def send(stream: ByteStream, frames: list[Any]) -> None:
    """Write framed bytes; the caller serializes concurrent senders.

    Small pieces are joined into one write; large ones are written as memoryviews, because
    paramiko's ``Channel.sendall`` slices what it is given once per 32 KiB packet (quadratic
    for a 100 MB ``bytes``, free for a memoryview).
    """
    small: list[Any] = []
    for piece in frames:
        if len(piece) <= _JOIN_MAX:
            small.append(piece)
            continue
        if small:
            stream.sendall(b"".join(small))
            small = []
        view = piece if isinstance(piece, memoryview) else memoryview(piece)
        # A buffer still arriving (node/relay.py) is forwarded as its bytes come.
        forward = getattr(view.obj, "forward_arriving", None)
        if forward is not None:
            forward(stream, view)
        else:
            stream.sendall(view)
    if small:
        stream.sendall(b"".join(small))


def recv_exact(stream: ByteStream, size: int) -> Any:
    """Read exactly ``size`` bytes or raise ``ConnectionClosed`` (a buffer when large)."""
    if size > _JOIN_MAX:
        return recv_buffer(stream, size)
    chunks, remaining = [], size
    while remaining:
        chunk = stream.recv(remaining)
        if not chunk:
            raise ConnectionClosed("connection closed by peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def recv_buffer(stream: ByteStream, size: int) -> bytearray | mmap.mmap:
    """Read exactly ``size`` bytes into a new writable buffer (straight from the kernel on
    sockets). From ``LAZY_MIN`` on it is anonymous memory that grows as bytes arrive: a header
    announcing gigabytes costs nothing until they are sent (and zeroing is skipped)."""
    buffer = new_buffer(size)
    fill(stream, buffer)
    return buffer


def new_buffer(size: int) -> bytearray | mmap.mmap:
    """A writable buffer for ``size`` bytes about to arrive: lazily mapped from ``LAZY_MIN``."""
    if size >= LAZY_MIN:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    return bytearray(size)


def fill(stream: ByteStream, buffer: bytearray | mmap.mmap | memoryview,
         progress: Callable[[int], None] | None = None) -> None:
    """Read ``len(buffer)`` bytes into ``buffer``, telling ``progress`` how many have arrived
    after each read; ``ConnectionClosed`` if the stream ends first."""
    size = len(buffer)
    view, got = memoryview(buffer), 0
    recv_into: Callable[[memoryview, int], int] | None = getattr(stream, "recv_into", None)
    try:
        while got < size:
            if recv_into is not None:
                n = recv_into(view[got:], min(size - got, _RECV_CHUNK))
            else:
                chunk = stream.recv(min(size - got, _RECV_CHUNK))
                n = len(chunk)
                view[got:got + n] = chunk
            if not n:
                raise ConnectionClosed("connection closed by peer")
            got += n
            if progress is not None:
                progress(got)
    finally:
        view.release()  # an mmap with an exported view cannot be freed


def decompress(payload: Any) -> bytes:
    """An lz4 payload, decompressed to exactly the size its frame declares.

    A payload declaring no size, an implausible one (more than ``LZ4_MAX_RATIO`` times its
    own), or holding more than it declares is a ``ProtocolError``: what a peer can make us
    allocate is bounded by what it sent.
    """
    try:
        declared = lz4.frame.get_frame_info(payload)["content_size"]
    except RuntimeError as exc:
        raise ProtocolError(f"malformed lz4 payload: {exc}") from exc
    if not 0 < declared <= LZ4_MAX_RATIO * len(payload):
        raise ProtocolError(f"an lz4 payload of {len(payload)} bytes declares {declared} bytes")
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        data: bytes = decompressor.decompress(payload, max_length=declared)
    except RuntimeError as exc:
        raise ProtocolError(f"malformed lz4 payload: {exc}") from exc
    if not decompressor.eof or len(data) != declared:
        raise ProtocolError("an lz4 payload does not hold the size it declares")
    return data


def read_token(stream: ByteStream, limit: int = MAX_TOKEN_FRAME) -> bytes:
    """The handshake's first frame: RAW, at most ``limit`` bytes; anything else is refused
    (``ProtocolError``) before its payload is read."""
    size, flags = HEADER.unpack(recv_exact(stream, HEADER.size))
    if flags != RAW:
        raise ProtocolError("the first frame must be the raw token")
    if size > limit:
        raise ProtocolError(f"a token frame of {size} bytes exceeds {limit}")
    return bytes(recv_exact(stream, size))


FrameHead = tuple[int, Any, list[int]]


def frame_steps() -> Generator[int, Any, FrameHead]:
    """The one parser of a frame's head, as steps free of I/O: it yields how many bytes it needs
    next and is sent exactly those bytes (a buffer from ``new_buffer`` when more than
    ``PIECE_MAX``); it returns the frame's kind (RAW, PICKLED or COMPRESSED), its payload
    (decompressed) and the sizes of the out-of-band buffers that follow (checked, unread).
    ``read_frame_head`` drives it from a blocking stream, ``frame_decoder.FrameDecoder`` from
    bytes as they arrive."""
    size, flags = HEADER.unpack((yield HEADER.size))
    kind = flags & _KIND
    if kind not in (RAW, PICKLED, COMPRESSED) or flags & ~(_KIND | BUFFERS):
        raise ProtocolError(f"unknown frame flags {flags:#x}")
    if kind == RAW and flags & BUFFERS:
        raise ProtocolError("a raw frame cannot carry buffers")
    payload = yield size
    if kind == COMPRESSED:
        payload = decompress(payload)
    sizes: list[int] = []
    if flags & BUFFERS:
        (count,) = COUNT.unpack((yield COUNT.size))
        if count > MAX_BUFFERS:
            raise ProtocolError(f"a frame announces {count} buffers (at most {MAX_BUFFERS})")
        table = yield SIZE.size * count
        sizes = [SIZE.unpack_from(table, i * SIZE.size)[0] for i in range(count)]
    return kind, payload, sizes


def read_frame_head(stream: ByteStream) -> FrameHead:
    """The next frame up to its out-of-band buffers: its kind (RAW, PICKLED or COMPRESSED),
    its payload (decompressed) and the sizes of the buffers that follow (checked, unread)."""
    steps = frame_steps()
    need = next(steps)
    try:
        while True:
            need = steps.send(recv_exact(stream, need))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def read_frame_with_buffers(stream: ByteStream) -> tuple[int, Any, list[Any]]:
    """The next frame's kind (RAW, PICKLED or COMPRESSED), payload (decompressed) and
    out-of-band buffers."""
    kind, payload, sizes = read_frame_head(stream)
    return kind, payload, [recv_buffer(stream, length) for length in sizes]


def read_message(stream: ByteStream) -> Any:
    """The next pickled message; only ever called on an authenticated connection."""
    return message_of(*read_frame_with_buffers(stream))


def message_of(kind: int, payload: Any, buffers: list[Any]) -> Any:
    """The message a frame carries; only ever called on an authenticated connection."""
    if kind == RAW:
        raise ProtocolError("unexpected raw frame after the handshake")
    return pickle.loads(payload, buffers=buffers)


def unbatch(message: Any) -> tuple[Any, ...]:
    """The messages a frame carried: a ``Batch``'s, or the message alone."""
    return message.messages if isinstance(message, Batch) else (message,)


def batched(messages: Sequence[Any]) -> Any:
    """One message for a frame: the message itself, or a ``Batch`` of several."""
    return messages[0] if len(messages) == 1 else Batch(tuple(messages))


class Channel:
    """One framed connection over a ``ByteStream`` (a socket, an SSH channel): the only way
    the client, the agent and the workers talk.

    - ``send(message)``: one message in one frame.
    - ``send_many(messages)``: several messages in one frame (a ``Batch``), handled in order by
      the peer; nothing is sent for none.
    - ``send_raw(data)``: raw bytes in one frame (the client's token, before anything else).
    - ``receive_raw(limit=MAX_TOKEN_FRAME)``: the peer's first frame, which must be RAW and at
      most ``limit`` bytes (the agent's handshake); anything else is refused unread.
    - ``receive() -> tuple[message, ...]``: the messages of the next frame, in order, a batch
      unpacked, with their out-of-band buffers.
    - ``close()``: closes the stream; a ``receive`` blocked in another thread then fails.

    Any thread may send (a lock keeps frames whole; pickling happens before taking it); one
    thread receives. ``receive`` raises ``ConnectionClosed`` when the peer closed,
    ``ProtocolError`` on a malformed frame, ``OSError`` from the stream; ``send*`` raise
    ``OSError``. ``stream`` is the wrapped stream (e.g. for ``select``).
    """

    def __init__(self, stream: ByteStream, writer: ByteStream | None = None) -> None:
        self.stream = stream
        #: What frames are written to: ``stream``, or a wrapper of it that writes to it while
        #: another thread reads it (the client's wire loop, remote/wire_streams.py).
        self.writer = writer or stream
        self._send_lock = threading.Lock()

    def send(self, message: object) -> None:
        self._write(encode(message))

    def send_many(self, messages: Sequence[Any]) -> None:
        if messages:
            self._write(encode(batched(messages)))

    def send_raw(self, data: bytes) -> None:
        self._write(encode_raw(data))

    def send_frames(self, frames: list[Any]) -> None:  # a frame received, passed on as it is
        self._write(frames)

    def receive_raw(self, limit: int = MAX_TOKEN_FRAME) -> bytes:
        return read_token(self.stream, limit)

    def receive(self) -> tuple[Any, ...]:
        return unbatch(read_message(self.stream))

    def close(self) -> None:
        if isinstance(self.stream, socket.socket):
            # close() alone leaves a recv blocked in another thread (and the connection) open.
            try:
                self.stream.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        close = getattr(self.stream, "close", None)
        if close is not None:
            close()

    def _write(self, frames: list[Any]) -> None:
        with self._send_lock:
            send(self.writer, frames)
