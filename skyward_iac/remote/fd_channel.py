"""The client's end of descriptor-carried buffers: a large argument goes to a Local agent's
Unix socket as a sealed memfd, not as its bytes (node/fd_buffers.py has the wire and the
agent's checks).

A task's large plain buffers are first copied into memfds the client reuses, lent to the task
until it ends (``memfd_arena.Loans``: ``send_many``). Then a frame (``protocol.encode``: header,
payload, size table, then one view per out-of-band buffer) is rewritten before it is sent: each
buffer of at least ``fd_buffers.DESCRIPTOR_MIN`` bytes (up to ``fd_buffers.MAX_DESCRIPTORS`` a
frame) goes as a descriptor: a lent slot's, marked ``LENT``, or else (a shared argument the
agent will keep, or with the arena off) a fresh memfd written once and sealed; it is marked in
the size table and dropped from the bytes; the descriptors go with the frame's head in one
``sendmsg`` and are closed here once sent (the agent holds its own). The memfds are filled
before the channel's send lock is taken, so a 100 MB copy does not hold up other senders.

Used only when the agent's ``Welcome`` says it takes descriptors (a Local agent's local socket)
and ``SKYWARD_LOCAL_DESCRIPTORS`` is not ``0`` (read per connection, to compare the two).
"""

from __future__ import annotations

import array
import fcntl
import os
import select
import socket
from typing import Any

from skyward_iac.api.switches import switched_on
from skyward_iac.node import fd_buffers, protocol
from skyward_iac.remote import memfd_arena

ENABLED_ENV = "SKYWARD_LOCAL_DESCRIPTORS"
#: Seconds a send of a frame's head waits at a time for room in the socket.
_WAIT_SLICE = 0.5


def enabled() -> bool:
    """Whether large buffers may go as descriptors (``SKYWARD_LOCAL_DESCRIPTORS`` not ``0``)."""
    return switched_on(ENABLED_ENV)


def channel(stream: Any, welcome: Any, writer: Any = None) -> protocol.Channel:
    """The channel to write ``stream``'s frames through: one that sends large buffers as
    memfds when ``stream`` is a Unix socket whose agent said it takes them, else a plain one."""
    if (isinstance(stream, socket.socket) and stream.family == socket.AF_UNIX
            and getattr(welcome, "descriptors", False) and enabled()):
        return DescriptorChannel(stream, writer)
    return protocol.Channel(stream, writer)


def loans_of(channel: protocol.Channel) -> memfd_arena.Loans | None:
    """The slots lent to the tasks sent on ``channel`` (None: it lends none)."""
    return channel.loans if isinstance(channel, DescriptorChannel) else None


class DescriptorChannel(protocol.Channel):
    """A ``protocol.Channel`` on a Unix socket whose large buffers go as sealed memfds."""

    def __init__(self, sock: socket.socket, writer: Any = None) -> None:
        super().__init__(sock, writer)
        self.sock = sock
        #: The slots its tasks hold (None: the arena is off).
        self.loans = (memfd_arena.Loans(memfd_arena.arena()) if memfd_arena.enabled()
                      else None)

    def send_many(self, messages: Any) -> None:
        if self.loans is not None:
            messages = self.loans.lend(messages)
        super().send_many(messages)

    def _write(self, frames: list[Any]) -> None:
        if len(frames) < 4:  # no out-of-band buffer (header, payload): the round trip's case
            super()._write(frames)
            return
        head, rest, fds = as_descriptors(frames)
        if not fds:
            super()._write(frames)
            return
        try:
            with self._send_lock:
                sent = _send_head(self.sock, head, fds)
                unsent = [b"".join(head)[sent:]] if sent < sum(map(len, head)) else []
                protocol.send(self.writer, unsent + rest)
        finally:
            for fd in fds:
                os.close(fd)


def as_descriptors(frames: list[Any]) -> tuple[list[Any], list[Any], list[int]]:
    """A frame from ``protocol.encode`` as its head (header, payload, size table), the bytes
    that follow it and the memfds that go with it: its large buffers written to sealed memfds
    (none: the frame as it was, all in the head and the rest)."""
    header = frames[0]
    _, flags = protocol.HEADER.unpack(header)
    if not flags & protocol.BUFFERS or len(frames) < 4:
        return frames, [], []
    table, views = frames[2], frames[3:]
    (count,) = protocol.COUNT.unpack_from(table)
    sizes = [protocol.SIZE.unpack_from(table, protocol.COUNT.size + i * protocol.SIZE.size)[0]
             for i in range(count)]
    if count != len(views):
        raise ValueError(f"a frame of {count} buffers came with {len(views)}")
    large = [i for i, view in enumerate(views)
             if memoryview(view).nbytes >= fd_buffers.DESCRIPTOR_MIN][:fd_buffers.MAX_DESCRIPTORS]
    if not large:
        return frames, [], []
    fds: list[int] = []
    try:
        for i in large:
            slot = memfd_arena.lent_slot(views[i])
            if slot is not None:
                fds.append(os.dup(slot.fd))
                sizes[i] |= fd_buffers.DESCRIPTOR | fd_buffers.LENT
            else:
                fds.append(sealed_memfd(views[i]))
                sizes[i] |= fd_buffers.DESCRIPTOR
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    table = protocol.COUNT.pack(count) + b"".join(protocol.SIZE.pack(s) for s in sizes)
    chosen = set(large)
    rest = [view for i, view in enumerate(views) if i not in chosen]
    return [header, frames[1], table], rest, fds


def sealed_memfd(buffer: Any) -> int:
    """A new memfd holding ``buffer``'s bytes, sealed against any change (one copy)."""
    with memoryview(buffer) as view, view.cast("B") as data:
        fd = memfd_arena.written_memfd(data, data.nbytes)
    try:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fd_buffers.CLIENT_SEALS)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _send_head(sock: socket.socket, head: list[Any], fds: list[int]) -> int:
    """Send the first bytes of ``head`` with ``fds`` (one ``sendmsg``, waiting while the
    socket is full, as it is non-blocking once the wire loop reads it); how many were sent."""
    while True:
        try:
            return sock.sendmsg(head, [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", fds).tobytes())])
        except (BlockingIOError, InterruptedError):
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLOUT)
            poller.poll(_WAIT_SLICE * 1000)

