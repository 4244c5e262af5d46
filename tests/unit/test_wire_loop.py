"""One wire loop serves every node connection of the client (remote/wire_loop.py): frames are
decoded as bytes arrive (node/frame_decoder.py) with the blocking reader's checks, a stalled or
hostile node leaves the others' results flowing, and the client's threads do not grow with its
connections."""

from __future__ import annotations

import mmap
import pickle
import queue
import random
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import lz4.frame
import pytest

from skyward_iac.collections import pki
from skyward_iac.node import data_port as node_port
from skyward_iac.node import protocol
from skyward_iac.node.frame_decoder import FrameDecoder
from skyward_iac.node.messages import Batch, Result, Started, Task, Welcome
from skyward_iac.remote import data_port, wire_loop
from skyward_iac.remote.agent_client import AgentClient, Submission
from skyward_iac.remote.wire_streams import wire_stream
from tests.agent_process import TOKEN, running_agent

WAIT = 60.0


def _wire(*messages: Any) -> bytes:
    """The bytes a peer sends for ``messages``, one frame each."""
    return b"".join(bytes(piece) for m in messages for piece in protocol.encode(m))


def _frames(data: bytes, chunks: Iterator[int]) -> list[Any]:
    """Every frame in ``data``, fed to a decoder in pieces of the sizes ``chunks`` gives."""
    decoder, frames, at = FrameDecoder(), [], 0
    while at < len(data):
        view = decoder.buffer()
        count = min(len(view), next(chunks), len(data) - at)
        view[:count] = data[at:at + count]
        at += count
        frames.extend(decoder.filled(count))
    assert not decoder.mid_frame
    return frames


def _decode(data: bytes, chunks: Iterator[int]) -> list[Any]:
    return [m for frame in _frames(data, chunks)
            for m in protocol.unbatch(protocol.message_of(*frame))]


def _blocking(data: bytes, frames: int) -> list[Any]:
    left, right = socket.socketpair()
    with left, right:
        threading.Thread(target=left.sendall, args=(data,), daemon=True).start()
        return [m for _ in range(frames) for m in protocol.unbatch(protocol.read_message(right))]


def _sample() -> list[Any]:
    big = bytearray(random.Random(7).randbytes(3 << 20))  # out of band, lazily mapped
    return [
        Started(1),
        Result(2, b"x" * 100_000),  # compressed, a payload larger than a staged piece
        Batch((Started(3), Result(3, b"small"), Result(4, None))),
        Task(5, "f", b"payload", 1.5, (pickle.PickleBuffer(big),)),
        Result(6, b"", buffers=(pickle.PickleBuffer(bytearray(70_000)), pickle.PickleBuffer(b""))),
    ]


@pytest.mark.parametrize("chunk", ["byte", "random", "whole"])
def test_the_incremental_decoder_reads_what_the_blocking_reader_reads(chunk: str) -> None:
    data = _wire(*_sample())
    rng = random.Random(3)
    sizes = {"byte": lambda: 1, "random": lambda: rng.randint(1, 300_000),
             "whole": lambda: len(data)}[chunk]
    frames = 5
    if chunk == "byte":  # byte by byte through the 3 MiB buffer would take long: its head only
        data, frames = _wire(*_sample()[:3]), 3
    decoded = _decode(data, iter(sizes, None))
    # In-band pickles compare the messages with their buffers' bytes.
    blocking = _blocking(data, frames)
    assert [pickle.dumps(m, 5) for m in decoded] == [pickle.dumps(m, 5) for m in blocking]


def test_small_frames_whole_in_one_read_or_split_after_their_header_are_read_alike() -> None:
    """The decoder takes whole plain frames from a read at once; a read that ends right after
    a header (the payload comes next, nothing staged) must not be taken for the next header."""
    messages = [Result(i, protocol.dumps(i * "v")) for i in range(1, 40)] + [Started(99)]
    data = _wire(*messages)
    assert [pickle.dumps(m, 5) for m in _decode(data, iter(lambda: len(data), None))] == \
        [pickle.dumps(m, 5) for m in messages]
    # Payloads that begin like a header (as no pickle does), each read after its header.
    payloads = [protocol.HEADER.pack(0, protocol.PICKLED) + bytes([i]) * i for i in range(1, 9)]
    data = b"".join(protocol.HEADER.pack(len(p), protocol.PICKLED) + p for p in payloads)
    sizes = [n for p in payloads for n in (protocol.HEADER.size, len(p))]
    assert [bytes(payload) for _, payload, _ in _frames(data, iter(sizes))] == payloads


def test_a_large_buffer_is_read_into_its_own_lazily_mapped_buffer() -> None:
    data = _wire(_sample()[3])
    (task,) = _decode(data, iter(lambda: 1 << 20, None))
    (buffer,) = task.buffers
    assert isinstance(buffer.obj if isinstance(buffer, memoryview) else buffer, mmap.mmap)
    assert zlib.crc32(buffer) == zlib.crc32(random.Random(7).randbytes(3 << 20))


@pytest.mark.parametrize("frame", [
    protocol.HEADER.pack(3, 0x47) + b"abc",  # unknown flags
    protocol.HEADER.pack(0, protocol.RAW | protocol.BUFFERS),  # a raw frame with buffers
    protocol.HEADER.pack(1, protocol.PICKLED | protocol.BUFFERS) + b"N"
    + struct.pack("!I", protocol.MAX_BUFFERS + 1),  # too many buffers
    protocol.HEADER.pack(len(z := lz4.frame.compress(b"\0" * 10_000_000)), protocol.COMPRESSED)
    + z,  # an lz4 payload declaring far more than it could hold... or not: checked either way
    protocol.HEADER.pack(11, protocol.COMPRESSED) + b"not-an-lz4!",
])
def test_the_incremental_decoder_refuses_what_the_blocking_reader_refuses(frame: bytes) -> None:
    def outcome(read: Any) -> str:
        try:
            read()
        except protocol.ProtocolError as exc:
            return f"refused: {exc}"
        return "accepted"

    left, right = socket.socketpair()
    with left, right:
        left.sendall(frame + b"\0" * 64)
        blocking = outcome(lambda: protocol.read_frame_head(right))
    incremental = outcome(lambda: _frames(frame, iter(lambda: 7, None)))
    assert blocking == incremental


# ---- the loop against real sockets ------------------------------------------------------------

def _welcomed() -> tuple[socket.socket, socket.socket]:
    """A connection whose far end has already said ``Welcome`` (it is ours to hold or break)."""
    ours, theirs = socket.socketpair()
    protocol.send(theirs, protocol.encode(Welcome(node=9, pid=1, python="3",
                                                  protocol=protocol.PROTOCOL_VERSION)))
    return ours, theirs


def _client_threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_the_clients_threads_do_not_grow_with_its_connections() -> None:
    before = set(threading.enumerate())
    pairs = [_welcomed() for _ in range(3)]
    clients = [AgentClient(ours, TOKEN, node=i) for i, (ours, _) in enumerate(pairs)]
    few = set(threading.enumerate())
    more_pairs = [_welcomed() for _ in range(60)]
    more = [AgentClient(ours, TOKEN, node=i) for i, (ours, _) in enumerate(more_pairs)]
    try:
        # (Compared as sets: other tests' threads may come and go meanwhile.)
        assert not {t.name for t in set(threading.enumerate()) - few}
        assert all(t.name in ("skyward-wire", "skyward-callbacks-1") for t in few - before)
        assert "skyward-wire" in _client_threads()
    finally:
        started = time.monotonic()
        for client in clients + more:
            client.close()
        for pair in pairs + more_pairs:
            pair[1].close()
    # Each close waits for the loop to let go of its descriptor: a loop that missed a wake-up
    # made each wait its 5 s limit.
    assert time.monotonic() - started < 30


def _hostile_peers() -> list[tuple[AgentClient, socket.socket]]:
    """Connections whose agents misbehave: half a frame then silence; a 1 GiB buffer trickling."""
    half, half_peer = _welcomed()
    whole = protocol.encode(Result(1, b"r" * 200))
    half_peer.sendall(bytes(whole[0]) + bytes(whole[1])[:50])
    slow, slow_peer = _welcomed()
    slow_peer.sendall(protocol.HEADER.pack(1, protocol.PICKLED | protocol.BUFFERS) + b"N"
                      + struct.pack("!I", 1) + struct.pack("!Q", 1 << 30))
    return [(AgentClient(half, TOKEN, node=7), half_peer),
            (AgentClient(slow, TOKEN, node=8), slow_peer)]


def test_a_stalled_or_hostile_node_leaves_the_others_results_flowing(tmp_path: Any) -> None:
    stop = threading.Event()
    hostile = _hostile_peers()
    slow_peer = hostile[1][1]

    def trickle() -> None:
        while not stop.wait(0.005):
            try:
                slow_peer.send(b"\1" * 4096)
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    with running_agent(tmp_path / "a", "--concurrency", "2", "--node", "1") as first, \
            running_agent(tmp_path / "b", "--concurrency", "2", "--node", "2") as second:
        good = [AgentClient(first.connect(), TOKEN, node=1),
                AgentClient(second.connect(), TOKEN, node=2)]
        try:
            call = protocol.dumps((pow, (2, 10), {}))
            for _ in range(30):
                futures = [c.submit("pow", call, timeout=WAIT) for c in good]
                assert [f.result(WAIT) for f in futures] == [1024, 1024]
            assert all(not c.closed for c, _ in hostile)  # still connected, still stuck
            assert all(c.in_flight == 0 for c in good)
        finally:
            stop.set()
            for client in good:
                client.close()
            for client, peer in hostile:
                client.close()
                peer.close()


def test_a_node_that_hangs_up_mid_frame_loses_its_tasks_and_no_one_elses() -> None:
    lost: list[tuple[int, list[Submission], str]] = []
    ours, theirs = _welcomed()
    client = AgentClient(ours, TOKEN, node=4, on_lost=lambda *report: lost.append(report))
    other_ours, other_theirs = _welcomed()
    other = AgentClient(other_ours, TOKEN, node=5)
    try:
        future: Future[Any] = client.submit("f", b"x", None)
        waiting = other.submit("g", b"x", None)
        protocol.read_token(theirs)
        protocol.read_message(theirs)  # read all we were sent: the close is then no reset
        theirs.sendall(bytes(protocol.encode(Result(1, b"v" * 500))[0]) + b"\x80")
        theirs.close()
        deadline = time.monotonic() + WAIT
        while not lost and time.monotonic() < deadline:
            time.sleep(0.01)
        (node, tasks, why), = lost
        assert node == 4 and [t.future for t in tasks] == [future]
        assert "middle of a frame" in why
        assert not other.closed and not waiting.done()
        protocol.send(other_theirs, protocol.encode(Result(1, protocol.dumps(42))))
        assert waiting.result(WAIT) == 42
    finally:
        client.close()
        other.close()
        other_theirs.close()


def test_tls_sends_from_several_threads_while_the_loop_reads_big_results(
        tmp_path: Any) -> None:
    """The data port's ``SSLSocket`` is written by callers and read by the loop at once; each
    SSL call holds the connection's lock, so 4 MiB arguments and results cross intact."""
    bundle = pki.generate_cluster_certificates("wire-test", ["127.0.0.1"])
    tls = tmp_path / "tls"
    tls.mkdir(mode=0o700)
    for name, text in ((node_port.CA_FILE, bundle.ca_pem), (node_port.CERT_FILE,
                       bundle.server_cert_pem), (node_port.KEY_FILE, bundle.server_key_pem)):
        (tls / name).write_text(text)
    port_file = tmp_path / "data.port"
    context = data_port.client_context(data_port.IssuedCertificate(
        bundle.ca_pem, bundle.client_cert_pem, bundle.client_key_pem))
    with running_agent(tmp_path / "agent", "--concurrency", "2", "--data-bind", "127.0.0.1",
                       "--tls-dir", str(tls), "--data-port-file", str(port_file)):
        client = AgentClient(data_port.connect("127.0.0.1", int(port_file.read_text()), context),
                             TOKEN, node=0)
        failures: list[BaseException] = []

        def submit_some(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(4):
                    data = bytearray(rng.randbytes(4 << 20))
                    payload, buffers = protocol.dumps_with_buffers((bytearray, (data,), {}))
                    assert client.submit("copy", payload, WAIT, buffers).result(WAIT) == data
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        senders = [threading.Thread(target=submit_some, args=(seed,)) for seed in range(3)]
        try:
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join(WAIT * 4)
            assert not failures and not client.closed
        finally:
            client.close()


def test_a_blocking_done_callback_runs_off_the_loop_and_holds_up_no_one() -> None:
    release, threads = threading.Event(), []
    pairs = [_welcomed() for _ in range(2)]
    first, second = (AgentClient(ours, TOKEN, node=i) for i, (ours, _) in enumerate(pairs))
    try:
        blocked = first.submit("f", b"x", None)
        blocked.add_done_callback(lambda f: (threads.append(threading.current_thread().name),
                                             release.wait(WAIT)))
        other = second.submit("g", b"x", None)
        for _, peer in pairs:
            protocol.send(peer, protocol.encode(Result(1, protocol.dumps("done"))))
        # The waiter is woken at once, while its callback still blocks on a callback thread.
        assert blocked.result(WAIT) == "done" and other.result(WAIT) == "done"
        deadline = time.monotonic() + WAIT
        while not threads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert threads and threads[0].startswith("skyward-callbacks")
    finally:
        release.set()
        first.close()
        second.close()
        for _, peer in pairs:
            peer.close()


@pytest.mark.parametrize("kind", ["epoll", "selectors"])
def test_the_loop_serves_and_lets_go_of_connections_with_epoll_or_the_selectors_module(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux waits on ``select.epoll`` itself; elsewhere (macOS) the ``selectors`` module's
    best: both serve a connection, let go of a detached one and of one closed under the loop
    whose descriptor number another connection then has."""
    if kind == "selectors":
        monkeypatch.setattr(wire_loop, "readiness", wire_loop.SelectorPoll)
    loop = wire_loop.WireLoop()  # a loop of its own (a daemon thread left waiting)
    got: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def served(sock: socket.socket, name: str) -> wire_loop.Reading:
        reading = wire_loop.Reading(
            wire_stream(sock),  # type: ignore[arg-type]
            lambda frames: [got.put((name, protocol.message_of(*f))) for f in frames],
            lambda exc: got.put((name, exc)))
        loop.register(reading)
        return reading

    pairs = [socket.socketpair() for _ in range(3)]
    try:
        first, second = served(pairs[0][0], "first"), served(pairs[1][0], "second")
        for name, (_, peer) in zip(["first", "second"], pairs, strict=False):
            peer.sendall(_wire(Started(len(name))))
            assert got.get(timeout=WAIT) == (name, Started(len(name)))
        loop.detach(first.stream)
        if kind == "epoll":
            # Closed under the loop, its number reused (the lowest free one: both ends are
            # tried): letting go of the old connection spares the new one.
            fd = second.fd
            pairs[1][0].close()
            pairs[1] = socket.socketpair()
            if pairs[1][1].fileno() == fd:
                pairs[1] = (pairs[1][1], pairs[1][0])
            assert pairs[1][0].fileno() == fd
            third = served(pairs[1][0], "third")
            loop.detach(second.stream)
        else:
            third = served(pairs[2][0], "third")
            pairs[1][1].close()
            name, ended = got.get(timeout=WAIT)
            assert name == "second" and isinstance(ended, protocol.ConnectionClosed)
        peer = pairs[1][1] if kind == "epoll" else pairs[2][1]
        peer.sendall(_wire(Started(3)))
        assert got.get(timeout=WAIT) == ("third", Started(3))
        assert got.empty()  # nothing from the detached first
        loop.detach(third.stream)
    finally:
        for left, right in pairs:
            left.close()
            right.close()
