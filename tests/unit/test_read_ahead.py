"""node/read_ahead.py: frames read through a ``ReadAhead`` are the frames sent, however the
bytes are cut, and a small frame costs one read."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from skyward_iac.node import protocol, read_ahead
from skyward_iac.node.messages import Cancel, Result, Task


class CountingSocket:
    """A socket whose reads are counted (``socket.socket`` cannot be given attributes)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reads = 0

    def recv(self, size: int) -> bytes:
        self.reads += 1
        return self.sock.recv(size)

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        self.reads += 1
        return self.sock.recv_into(buffer, nbytes)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_small_frames_sent_together_are_read_from_one_read(pair):
    a, b = pair
    counting = CountingSocket(b)
    stream = read_ahead.ReadAhead(counting)  # type: ignore[arg-type]
    messages = [Task(i, "f", b"payload" * i, None) for i in range(3)] + [Cancel(7)]
    a.sendall(b"".join(b"".join(protocol.encode(m)) for m in messages))
    got = [read_ahead.receive(stream) for _ in messages]
    assert [m for (m,) in got] == messages
    assert counting.reads == 1
    assert not stream.pending()


def test_a_frame_cut_anywhere_is_read_whole(pair):
    a, b = pair
    stream = read_ahead.ReadAhead(b)
    frame = b"".join(protocol.encode(Result(3, value=b"x" * 5000)))
    for cut in (1, 3, 5, 6, 4000):  # inside the header, at its end, inside the payload

        def send_in_two(cut: int = cut) -> None:
            a.sendall(frame[:cut])
            threading.Event().wait(0.02)
            a.sendall(frame[cut:])

        sender = threading.Thread(target=send_in_two)
        sender.start()
        assert read_ahead.receive(stream) == (Result(3, value=b"x" * 5000),)
        sender.join()


def test_frames_with_buffers_or_lz4_go_through_the_general_parser(pair):
    a, b = pair
    stream = read_ahead.ReadAhead(b)
    array = np.arange(200_000, dtype=np.int64)  # 1.6 MB: an out-of-band buffer
    payload, buffers = protocol.dumps_with_buffers(array)
    compressible = Result(1, value=b"a" * 100_000)  # lz4 pays: a COMPRESSED frame
    frames = [protocol.encode(Task(1, "f", payload, None, buffers)), protocol.encode(compressible),
              protocol.encode(Cancel(2))]
    sender = threading.Thread(target=lambda: [a.sendall(b"".join(bytes(p) for p in f))
                                              for f in frames])
    sender.start()
    (task,) = read_ahead.receive(stream)
    np.testing.assert_array_equal(protocol.loads(task.payload, task.buffers), array)
    assert read_ahead.receive(stream) == (compressible,)
    assert read_ahead.receive(stream) == (Cancel(2),)
    sender.join()


def test_recv_into_takes_what_was_read_ahead_first(pair):
    a, b = pair
    stream = read_ahead.ReadAhead(b)
    a.sendall(b"0123456789")
    assert stream.recv(4) == b"0123"
    assert stream.pending()
    buffer = bytearray(6)
    assert stream.recv_into(memoryview(buffer), 6) == 6
    assert bytes(buffer) == b"456789"
    assert not stream.pending()


def test_the_end_of_the_stream_is_connection_closed(pair):
    a, b = pair
    stream = read_ahead.ReadAhead(b)
    a.sendall(b"".join(protocol.encode(Cancel(1)))[:3])  # half a header, then the end
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(protocol.ConnectionClosed):
        read_ahead.receive(stream)


def test_close_unblocks_a_reader_in_another_thread(pair):
    _, b = pair
    stream = read_ahead.ReadAhead(b)
    failed: list[BaseException] = []

    def read() -> None:
        try:
            read_ahead.receive(stream)
        except (protocol.ConnectionClosed, OSError) as exc:
            failed.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    threading.Event().wait(0.05)
    stream.close()
    reader.join(5)
    assert not reader.is_alive() and failed
