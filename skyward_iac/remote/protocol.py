"""The wire protocol between the client and a node's agent.

A frame is a 5-byte header (payload length, flags) and a payload. The first frame of a
connection is RAW: the per-stack token, checked before the agent unpickles anything. Every later
payload is a cloudpickled message, lz4-compressed when that makes it meaningfully smaller.
User code and values travel as nested pickles (``Task.payload``, ``Result.value``), so a
failure to rebuild them is reported per task instead of breaking the connection.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Protocol

import cloudpickle
import lz4.frame

HEADER = struct.Struct("!IB")
RAW, PICKLED, COMPRESSED = 0, 1, 2
COMPRESS_MIN = 4096
MAX_FRAME = 2**32 - 1


class ByteStream(Protocol):
    """A socket or an SSH channel."""

    def sendall(self, data: bytes, /) -> Any: ...
    def recv(self, size: int, /) -> bytes: ...


class ConnectionClosed(EOFError):
    """The peer closed the connection."""


@dataclass(frozen=True, slots=True)
class Welcome:
    """The agent's answer to a valid token."""

    node: int
    pid: int
    python: str


@dataclass(frozen=True, slots=True)
class Configure:
    """Sent after ``Welcome``: the node's place in the pool (an ``InstanceInfo`` as a dict) and
    how its tasks reach the collections (a ``collections.BackendConfig``, or None)."""

    instance: dict[str, Any]
    collections: Any = None


@dataclass(frozen=True, slots=True)
class Output:
    """A piece of a running task's stdout or stderr, streamed live."""

    task_id: int
    stream: str
    text: str


@dataclass(frozen=True, slots=True)
class Task:
    """Run ``payload`` (a pickled ``(fn, args, kwargs)``); ``name`` is for messages only."""

    task_id: int
    name: str
    payload: bytes
    timeout: float | None


@dataclass(frozen=True, slots=True)
class Cancel:
    """The client gave up on a task (timeout): its result is no longer wanted."""

    task_id: int


@dataclass(frozen=True, slots=True)
class Failure:
    """A task's exception: its type, message, remote traceback and, if picklable, itself."""

    type_name: str
    message: str
    traceback: str
    exception: bytes | None


@dataclass(frozen=True, slots=True)
class Result:
    """A task's outcome: ``value`` (a pickle) or ``failure``."""

    task_id: int
    value: bytes | None = None
    failure: Failure | None = None


def dumps(obj: Any) -> bytes:
    """cloudpickle with protocol 5."""
    return cloudpickle.dumps(obj, protocol=5)


def encode(obj: Any) -> list[bytes]:
    """Frame a message: header and payload, compressed only when it pays."""
    payload = dumps(obj)
    flags = PICKLED
    if len(payload) >= COMPRESS_MIN:
        packed = lz4.frame.compress(payload)
        if len(packed) < len(payload) * 0.9:
            payload, flags = packed, COMPRESSED
    return _framed(payload, flags)


def encode_raw(data: bytes) -> list[bytes]:
    """Frame raw bytes (the handshake token)."""
    return _framed(data, RAW)


def _framed(payload: bytes, flags: int) -> list[bytes]:
    if len(payload) > MAX_FRAME:
        raise ValueError(f"message of {len(payload)} bytes exceeds the 4 GiB frame limit")
    return [HEADER.pack(len(payload), flags), payload]


def send(stream: ByteStream, frames: list[bytes]) -> None:
    """Write framed bytes; the caller serializes concurrent senders."""
    header, payload = frames
    if len(payload) < 65536:
        stream.sendall(header + payload)
    else:
        stream.sendall(header)
        stream.sendall(payload)


def recv_exact(stream: ByteStream, size: int) -> bytes:
    """Read exactly ``size`` bytes or raise ``ConnectionClosed``."""
    chunks, remaining = [], size
    while remaining:
        chunk = stream.recv(min(remaining, 1 << 20))
        if not chunk:
            raise ConnectionClosed("connection closed by peer")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_frame(stream: ByteStream) -> tuple[int, bytes]:
    """The next frame's flags and (decompressed) payload."""
    size, flags = HEADER.unpack(recv_exact(stream, HEADER.size))
    payload = recv_exact(stream, size)
    if flags == COMPRESSED:
        payload = lz4.frame.decompress(payload)
    return flags, payload


def read_message(stream: ByteStream) -> Any:
    """The next pickled message; only ever called on an authenticated connection."""
    flags, payload = read_frame(stream)
    if flags == RAW:
        raise ValueError("unexpected raw frame after the handshake")
    return cloudpickle.loads(payload)
