"""The fast paths of the wire protocol: batches, out-of-band buffers, lz4 only when it pays,
and the agent's slots sending tasks ahead to a worker without losing crash semantics."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest

from skyward_iac.api.errors import WorkerCrashedError
from skyward_iac.node import messages, protocol
from skyward_iac.node.messages import Batch, Result, Task
from skyward_iac.node.slots import Slots
from skyward_iac.node.worker import run_task


def roundtrip(message: object) -> tuple[Any, int]:
    left, right = socket.socketpair()
    with left, right:
        frames = protocol.encode(message)
        sender = threading.Thread(target=protocol.send, args=(left, frames))
        sender.start()  # large frames exceed the socket buffer: read while it writes
        received = protocol.read_message(right)
        sender.join()
        return received, protocol.HEADER.unpack(frames[0])[1]


def test_a_batch_carries_several_messages_in_order() -> None:
    tasks = tuple(Task(i, "f", bytes([i]) * 10, 5.0) for i in range(3))
    message, _ = roundtrip(protocol.batched(list(tasks)))
    assert isinstance(message, Batch)
    assert protocol.unbatch(message) == tasks


def test_a_single_message_is_not_wrapped_in_a_batch() -> None:
    task = Task(1, "f", b"x", None)
    assert protocol.batched([task]) is task
    assert protocol.unbatch(task) == (task,)


def test_large_buffers_travel_out_of_band_and_come_back_equal() -> None:
    blob = bytearray(os.urandom(300_000))
    message, flags = roundtrip(Task(7, "f", b"call", None, (blob,)))
    assert flags & protocol.BUFFERS
    assert message.payload == b"call" and bytes(message.buffers[0]) == bytes(blob)


class _RecvOnly:
    """A stream with ``recv`` but no ``recv_into`` (as a paramiko channel)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)


@pytest.mark.parametrize("recv_only", [False, True], ids=["recv_into", "recv"])
def test_a_mapped_buffer_arriving_in_uneven_pieces_is_received_whole(recv_only: bool) -> None:
    """Buffers from ``LAZY_MIN`` on are lazily mapped (huge pages where offered): bytes that
    arrive in odd-sized writes still land in order, whichever read the stream offers."""
    blob = os.urandom(protocol.LAZY_MIN * 3 + 12345)
    left, right = socket.socketpair()

    def write() -> None:
        for start in range(0, len(blob), 777_777):  # not a multiple of any page size
            left.sendall(blob[start:start + 777_777])

    with left, right:
        writer = threading.Thread(target=write)
        writer.start()
        received = protocol.recv_buffer(_RecvOnly(right) if recv_only else right, len(blob))
        writer.join()
    assert bytes(received) == blob


def test_the_pickle_of_an_out_of_band_message_stays_small() -> None:
    frames = protocol.encode(Result(1, value=b"v", buffers=(bytearray(1_000_000),)))
    size, _ = protocol.HEADER.unpack(frames[0])
    assert size < 1000  # the megabyte is not inside the pickle


def test_a_numpy_argument_is_kept_out_of_the_pickle_and_rebuilt() -> None:
    array = np.arange(100_000, dtype=np.float64)
    payload, buffers = protocol.dumps_with_buffers((np.sum, (array,), {}), copy=True)
    assert len(buffers) == 1 and len(payload) < 1000
    fn, args, _ = protocol.loads(payload, buffers)
    assert fn(*args) == array.sum()


def test_a_copied_argument_does_not_see_later_changes() -> None:
    array = np.ones(100_000)
    payload, buffers = protocol.dumps_with_buffers(array, copy=True)
    array[:] = 0
    assert protocol.loads(payload, buffers).sum() == 100_000


def test_small_and_non_contiguous_arrays_stay_in_band() -> None:
    small = np.arange(10)
    strided = np.arange(200_000)[::2]
    for value in (small, strided):
        payload, buffers = protocol.dumps_with_buffers(value)
        assert buffers == ()
        assert np.array_equal(protocol.loads(payload), value)


def test_a_task_with_a_numpy_argument_round_trips_through_frames_and_runs() -> None:
    array = np.arange(50_000, dtype=np.int64)
    payload, buffers = protocol.dumps_with_buffers((np.sum, (array,), {}))
    task, _ = roundtrip(Task(3, "sum", payload, None, buffers))
    result = run_task(task)
    assert result.failure is None
    assert protocol.loads(result.value or b"", result.buffers) == array.sum()


def test_a_large_numpy_result_comes_back_out_of_band() -> None:
    payload = protocol.dumps((np.zeros, (100_000,), {}))
    result = run_task(Task(4, "zeros", payload, None))
    assert len(result.buffers) == 1
    received, _ = roundtrip(result)
    value = protocol.loads(received.value, received.buffers)
    assert value.shape == (100_000,) and not value.any()


def test_a_large_incompressible_payload_skips_lz4_and_a_compressible_one_uses_it() -> None:
    noise = os.urandom(1_000_000)
    assert roundtrip(Result(1, value=noise)) == (Result(1, value=noise), protocol.PICKLED)
    zeros = bytes(1_000_000)
    assert roundtrip(Result(2, value=zeros)) == (Result(2, value=zeros), protocol.COMPRESSED)


def test_the_handshake_reader_refuses_a_frame_announcing_buffers() -> None:
    left, right = socket.socketpair()
    with left, right:
        left.sendall(protocol.HEADER.pack(3, protocol.RAW | protocol.BUFFERS) + b"abc")
        with pytest.raises(protocol.ProtocolError, match="raw token"):
            protocol.Channel(right).receive_raw()


class RecordingStream:
    """A stream that records what each write was given."""

    def __init__(self) -> None:
        self.writes: list[Any] = []

    def sendall(self, data: Any) -> None:
        self.writes.append(data)

    def recv(self, size: int) -> bytes:
        raise NotImplementedError


def test_large_pieces_are_written_as_memoryviews_small_ones_joined() -> None:
    stream = RecordingStream()
    protocol.send(stream, protocol.encode(Task(1, "f", b"x", None, (bytearray(200_000),))))
    kinds = [type(w) for w in stream.writes]
    assert kinds == [bytes, memoryview]  # header + pickle + buffer table, then the buffer


# ---- slots: tasks sent ahead to a worker --------------------------------------------------


class Inbox:
    """A route that collects the results the slots deliver."""

    def __init__(self) -> None:
        self.results: dict[int, Result] = {}
        self.cond = threading.Condition()

    def send_many(self, messages: list[object]) -> None:
        with self.cond:
            for item in messages:
                if isinstance(item, Result):
                    self.results[item.task_id] = item
            self.cond.notify_all()

    def wait(self, ids: set[int], timeout: float = 30) -> dict[int, Result]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not ids <= self.results.keys():
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"results missing: {ids - self.results.keys()}"
                self.cond.wait(remaining)
            return {i: self.results[i] for i in ids}


def call(task_id: int, fn: Any, *args: Any) -> Task:
    return Task(task_id, getattr(fn, "__name__", "fn"), protocol.dumps((fn, args, {})), None)


@pytest.fixture
def lone_worker() -> Any:
    slots = Slots(1, 1, once=False, node=0)
    yield slots
    for worker in slots.workers:
        worker.kill()


def test_tasks_queued_in_a_crashed_worker_run_on_its_successor(lone_worker: Slots) -> None:
    inbox = Inbox()
    lone_worker.submit_many([call(1, os._exit, 3), call(2, abs, -2), call(3, abs, -3)], inbox)
    results = inbox.wait({1, 2, 3})
    assert results[1].failure is not None
    assert results[1].failure.type_name.endswith(WorkerCrashedError.__name__)
    assert protocol.loads(results[2].value or b"") == 2
    assert protocol.loads(results[3].value or b"") == 3


def test_cancelling_a_task_queued_in_a_worker_skips_it_and_spares_the_running_one(
        lone_worker: Slots, tmp_path: Any) -> None:
    inbox = Inbox()
    marker = str(tmp_path / "ran")
    lone_worker.submit_many([call(1, time.sleep, 0.5), call(2, os.mkdir, marker),
                             call(3, abs, -3)], inbox)
    time.sleep(0.1)
    pid = lone_worker.workers[0].process.pid
    lone_worker.cancel(2)
    results = inbox.wait({1, 3})
    assert results[1].failure is None  # the running task finished normally
    assert protocol.loads(results[3].value or b"") == 3
    assert lone_worker.workers[0].process.pid == pid  # same worker: nothing was killed
    assert 2 not in inbox.results and not os.path.exists(marker)  # skipped, never run


# ---- functions pickled once ----------------------------------------------------------------


def test_a_pickled_function_is_rebuilt_once_per_process() -> None:
    blob = protocol.dumps(lambda x: x * 2)
    first = protocol.loads(protocol.dumps((messages.PickledFunction(blob), (3,), {})))
    second = protocol.loads(protocol.dumps((messages.PickledFunction(blob), (4,), {})))
    assert first[0] is second[0]
    assert first[0](*first[1]) == 6 and second[0](*second[1]) == 8
