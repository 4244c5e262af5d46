"""A node connection as the wire loop reads it: never blocking, while callers write to it.

The client reads every node connection from one thread (remote/wire_loop.py) and writes from
the caller's thread (a submit sends at once: no hand-off on the round trip). Three kinds of
stream carry an agent connection, each adapted here to ``recv_into`` that returns None rather
than wait:

- a plain socket (tests, the fleet simulator): made non-blocking; ``sendall`` writes what the
  kernel takes and waits for writability (``poll``: no fd-number limit) for the rest.
- an ``ssl.SSLSocket`` (the data port, remote/data_port.py): the same, and one lock per
  connection (a plain socket needs none) is held around every SSL read and write, because an SSL object must not be used by
  two threads at once. The lock is never held while waiting, so a send stalled by a slow peer
  does not hold up the loop. (A ``MemoryBIO`` would also work, but would redo in Python the
  socket I/O the ``SSLSocket`` the data port hands over already does.)
- a paramiko ``Channel`` (the SSH tunnel fallback): its ``fileno`` is selectable and ``recv``
  once ``recv_ready()`` returns what is buffered; paramiko serializes its own sends and reads.
"""

from __future__ import annotations

import errno
import select
import socket
import ssl
import threading
from typing import Any, Protocol

from skyward_iac.node.read_ahead import close_socket

#: A TLS write of at most this much at a time (retried whole after a would-block).
_SEND_CHUNK = 1 << 20
_WOULD_BLOCK_WRITE = (ssl.SSLWantWriteError, BlockingIOError, InterruptedError)
_WOULD_BLOCK = (*_WOULD_BLOCK_WRITE, ssl.SSLWantReadError)
#: Seconds between checks that a connection waited on for writing is still open.
_WAIT_SLICE = 0.5


class WireStream(Protocol):
    """One node connection as the wire loop serves it."""

    #: Whether ``close`` may wait (then the loop has another thread close it).
    close_may_wait: bool

    def fileno(self) -> int: ...
    def recv_into(self, view: memoryview) -> int | None:
        """Bytes read into ``view`` (0: the peer closed), None when none are there yet."""
    def buffered(self) -> bool:
        """Whether bytes wait above the socket (decrypted TLS, paramiko's buffer), which a
        selector would not report."""
    def sendall(self, data: Any) -> None: ...
    def close(self) -> None: ...


def wire_stream(stream: Any) -> WireStream | None:
    """``stream`` adapted for the wire loop; None for one it cannot watch (no file descriptor:
    a test double), which the client then reads from a thread of its own."""
    if isinstance(stream, ssl.SSLSocket):
        return TlsStream(stream)
    if isinstance(stream, socket.socket):
        return SocketStream(stream)
    if hasattr(stream, "recv_ready") and hasattr(stream, "fileno"):
        return ChannelStream(stream)
    return None


class SocketStream:
    """A plain socket, non-blocking from now on (see the module doc): the loop reads it while
    callers write to it, which a socket allows without a lock."""

    close_may_wait = False

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def recv_into(self, view: memoryview) -> int | None:
        try:
            return self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return None

    def buffered(self) -> bool:
        return False

    def sendall(self, data: Any) -> None:
        if type(data) is bytes and len(data) <= _SEND_CHUNK:
            # The common case (a small frame, joined with its header): taken whole at once.
            try:
                sent = self._send_now(data)
            except _WOULD_BLOCK:
                sent = 0  # written below, as any other
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
        view = data if isinstance(data, memoryview) else memoryview(data)
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        while view:
            view = view[self._send(view[:_SEND_CHUNK]):]

    def _send_now(self, chunk: Any) -> int:
        """Bytes of ``chunk`` the socket took, without waiting (would-block errors raised)."""
        return self.sock.send(chunk)

    def _send(self, chunk: memoryview) -> int:
        """Bytes of ``chunk`` written, waiting while the peer is not reading."""
        while True:
            try:
                return self._send_now(chunk)
            except _WOULD_BLOCK_WRITE:
                event = select.POLLOUT
            except ssl.SSLWantReadError:  # TLS 1.3 housekeeping: the loop reads it meanwhile
                event = select.POLLIN
            self._wait(event)

    def _wait(self, event: int) -> None:
        fd = self.sock.fileno()
        if fd < 0:
            raise OSError(errno.EBADF, "connection closed")
        poller = select.poll()
        poller.register(fd, event)
        poller.poll(_WAIT_SLICE * 1000 if event == select.POLLOUT else 50)

    def close(self) -> None:
        close_socket(self.sock)


class TlsStream(SocketStream):
    """An ``ssl.SSLSocket``: as a plain socket, with every SSL call under the connection's lock
    (an SSL object is not thread-safe; the lock is never held while waiting)."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        super().__init__(sock)
        self._lock = threading.Lock()

    def recv_into(self, view: memoryview) -> int | None:
        try:
            with self._lock:
                return self.sock.recv_into(view, len(view))
        except _WOULD_BLOCK:
            return None
        except ssl.SSLZeroReturnError:
            return 0

    def buffered(self) -> bool:
        with self._lock:
            return self.sock.pending() > 0  # type: ignore[attr-defined]

    def _send_now(self, chunk: Any) -> int:
        with self._lock:
            return self.sock.send(chunk)


class ChannelStream:
    """A paramiko ``Channel`` (the SSH tunnel); left blocking, read only when it has bytes."""

    close_may_wait = True

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def fileno(self) -> int:
        return int(self.channel.fileno())

    def recv_into(self, view: memoryview) -> int | None:
        channel = self.channel
        if channel.recv_ready():
            data = channel.recv(len(view))  # paramiko has no recv_into: one copy, as before
            view[:len(data)] = data
            return len(data)
        if channel.eof_received or channel.closed:
            return 0
        return None

    def buffered(self) -> bool:
        return bool(self.channel.recv_ready())

    def sendall(self, data: Any) -> None:
        self.channel.sendall(data)

    def close(self) -> None:
        self.channel.close()
