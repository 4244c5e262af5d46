"""What a peer can make the agent allocate: nothing before the token, bounded after it.

Against a real agent process: frames announcing gigabytes, or an lz4 bomb, as the first frame
must be refused from their header, and the agent's peak memory must barely move.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import lz4.frame
import pytest

from skyward_iac.node import protocol
from tests.agent_process import (
    TOKEN,
    Agent,
    closed_without_greeting,
    peak_rss_mb,
    rss_mb,
    running_agent,
)

GIB = 1 << 30
#: How much a refused frame may grow the agent's peak memory (threads, buffers, logging).
GROWTH_MB = 50


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    with running_agent(tmp_path_factory.mktemp("agent-limits")) as started:
        yield started


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """1 GiB of zeros as one lz4 frame (about 4 MB) that does not declare its size."""
    compressor = lz4.frame.LZ4FrameCompressor()
    chunk = bytes(16 << 20)
    parts = [compressor.begin()] + [compressor.compress(chunk) for _ in range(GIB // len(chunk))]
    return b"".join(parts) + compressor.flush()


def send_and_check_refused(agent: Agent, data: bytes, authenticate: bool = False) -> None:
    before = peak_rss_mb(agent.pid)
    with agent.connect() as sock:
        channel = protocol.Channel(sock)
        if authenticate:
            channel.send_raw(TOKEN.encode())
            assert type(channel.receive()[0]).__name__ == "Welcome"
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we were still sending: what we want
        assert closed_without_greeting(sock), "the agent kept the connection open"
    time.sleep(0.2)
    growth = peak_rss_mb(agent.pid) - before
    assert growth < GROWTH_MB, f"the agent's peak memory grew by {growth:.0f} MB"


def test_a_gigabyte_length_prefix_before_the_token_is_refused_unread(agent: Agent) -> None:
    send_and_check_refused(agent, protocol.HEADER.pack(GIB, protocol.RAW) + b"x" * 65536)


def test_a_token_frame_just_over_the_limit_is_refused(agent: Agent) -> None:
    size = protocol.MAX_TOKEN_FRAME + 1
    send_and_check_refused(agent, protocol.HEADER.pack(size, protocol.RAW) + b"x" * size)


def test_an_lz4_bomb_as_the_first_frame_is_never_decompressed(agent: Agent, bomb: bytes) -> None:
    send_and_check_refused(agent, protocol.HEADER.pack(len(bomb), protocol.COMPRESSED) + bomb)


def test_out_of_band_buffers_before_the_token_are_refused(agent: Agent) -> None:
    flags = protocol.PICKLED | protocol.BUFFERS
    send_and_check_refused(agent, protocol.HEADER.pack(GIB, flags) + b"x" * 65536)


def test_an_lz4_bomb_after_the_token_closes_the_connection_undecompressed(
        agent: Agent, bomb: bytes) -> None:
    frame = protocol.HEADER.pack(len(bomb), protocol.COMPRESSED) + bomb
    send_and_check_refused(agent, frame, authenticate=True)


def test_the_agent_still_serves_after_hostile_frames(agent: Agent) -> None:
    from skyward_iac.remote.agent_client import AgentClient

    client = AgentClient(agent.connect(), TOKEN, node=0)
    try:
        assert client.submit("abs", protocol.dumps((abs, (-5,), {})), 10).result(10) == 5
    finally:
        client.close()


# ---- bounds on an authenticated channel (socket pairs) -----------------------------------


def refused(data: bytes) -> protocol.ProtocolError:
    left, right = socket.socketpair()
    with left, right:
        right.settimeout(5)  # a reader that waits for what the header announced fails too
        sender = threading.Thread(target=lambda: left.sendall(data), daemon=True)
        sender.start()
        with pytest.raises(protocol.ProtocolError) as caught:
            protocol.Channel(right).receive()
        return caught.value


def test_an_lz4_payload_without_a_declared_size_is_refused(bomb: bytes) -> None:
    error = refused(protocol.HEADER.pack(len(bomb), protocol.COMPRESSED) + bomb)
    assert "declares 0 bytes" in str(error)


def lying_frame(declared: int, data: bytes) -> bytes:
    """An lz4 frame whose header declares ``declared`` bytes but which holds ``data`` (lz4
    itself refuses to end such a frame, so it has no end mark)."""
    compressor = lz4.frame.LZ4FrameCompressor()
    return compressor.begin(source_size=declared) + compressor.compress(data)


def test_an_lz4_payload_declaring_an_implausible_size_is_refused() -> None:
    frame = lying_frame(GIB, b"x" * 1000)
    error = refused(protocol.HEADER.pack(len(frame), protocol.COMPRESSED) + frame)
    assert f"declares {GIB} bytes" in str(error)


def test_an_lz4_payload_holding_more_than_it_declares_is_refused() -> None:
    frame = lying_frame(1000, bytes(1 << 20))
    error = refused(protocol.HEADER.pack(len(frame), protocol.COMPRESSED) + frame)
    assert "does not hold the size it declares" in str(error)


def test_a_frame_announcing_too_many_buffers_is_refused_before_its_table() -> None:
    payload = protocol.dumps(None)
    frame = (protocol.HEADER.pack(len(payload), protocol.PICKLED | protocol.BUFFERS) + payload
             + protocol.COUNT.pack(protocol.MAX_BUFFERS + 1))
    assert "buffers" in str(refused(frame))


def test_unknown_flags_are_refused() -> None:
    assert "flags" in str(refused(protocol.HEADER.pack(1, 0x47) + b"x"))


def test_memory_follows_the_bytes_received_not_the_size_announced() -> None:
    """A buffer announced as 1 GiB of which 1 MiB arrived costs about 1 MiB."""
    payload = protocol.dumps(None)
    head = (protocol.HEADER.pack(len(payload), protocol.PICKLED | protocol.BUFFERS) + payload
            + protocol.COUNT.pack(1) + protocol.SIZE.pack(GIB))
    left, right = socket.socketpair()
    failure: list[BaseException] = []

    def receive() -> None:
        try:
            protocol.Channel(right).receive()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    pid = os.getpid()
    before = rss_mb(pid)
    reader = threading.Thread(target=receive, daemon=True)
    reader.start()
    left.sendall(head + bytes(1 << 20))
    time.sleep(0.5)  # the reader has taken the MiB and waits for the rest
    growth = rss_mb(pid) - before
    left.close()
    reader.join(10)
    right.close()
    assert growth < GROWTH_MB, f"receiving 1 MiB of an announced GiB took {growth:.0f} MB"
    assert failure and isinstance(failure[0], protocol.ConnectionClosed)
