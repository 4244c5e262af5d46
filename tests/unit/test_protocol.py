"""Frames: round trips, compression only when it pays, raw handshake frames."""

from __future__ import annotations

import os
import socket

import pytest

from skyward_iac.node import protocol
from skyward_iac.node.messages import Result, Task


def roundtrip(message: object) -> tuple[object, int]:
    left, right = socket.socketpair()
    with left, right:
        frames = protocol.encode(message)
        protocol.send(left, frames)
        size, flags = protocol.HEADER.unpack(frames[0])
        return protocol.read_message(right), flags


def test_small_message_is_not_compressed() -> None:
    message, flags = roundtrip(Task(1, "f", b"x" * 10, None))
    assert message == Task(1, "f", b"x" * 10, None) and flags == protocol.PICKLED


def test_compressible_message_is_compressed() -> None:
    message, flags = roundtrip(Result(7, value=b"a" * 100_000))
    assert message == Result(7, value=b"a" * 100_000) and flags == protocol.COMPRESSED


def test_incompressible_message_is_sent_raw() -> None:
    noise = os.urandom(200_000)
    message, flags = roundtrip(Result(8, value=noise))
    assert message == Result(8, value=noise) and flags == protocol.PICKLED


def test_raw_frames_are_refused_after_the_handshake() -> None:
    left, right = socket.socketpair()
    with left, right:
        protocol.send(left, protocol.encode_raw(b"token"))
        with pytest.raises(ValueError, match="unexpected raw frame"):
            protocol.read_message(right)


def test_closed_peer_raises_connection_closed() -> None:
    left, right = socket.socketpair()
    with right:
        left.sendall(protocol.HEADER.pack(10, protocol.PICKLED) + b"abc")
        left.close()
        with pytest.raises(protocol.ConnectionClosed):
            protocol.read_message(right)
