"""The agent passes small frames on as received (node/relay.py): a client's frame of tasks to
the worker that takes all of them, a worker's frame to the one client all its messages are
for. The agent pickles nothing again on that path, and every message still arrives, in order,
with cancels, output and crash accounting unchanged."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from skyward_iac.node import protocol, relay
from skyward_iac.node.agent import Connection
from skyward_iac.node.messages import Cancel, Output, Result, Started, Task
from skyward_iac.node.slots import Slots
from skyward_iac.node.worker import run_task

#: Pickled by value (a lambda): the worker need not import this test module.
_shout = lambda text: print(text) or text.upper()


def _call(task_id: int, fn: Any, *args: Any) -> Task:
    return Task(task_id, getattr(fn, "__name__", "fn"), protocol.dumps((fn, args, {})), None)


class _Agent:
    """The agent's side of one client connection, in this process (``Connection`` over
    ``relay.serve``) with a real worker process behind it; ``encoded`` counts what the agent's
    threads pickled into frames."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.slots = Slots(1, 1, once=False, node=0)
        ours, theirs = socket.socketpair()
        self.client = protocol.Channel(ours)
        self.encoded: list[str] = []
        encode, client_thread = protocol.encode, threading.current_thread()

        def counting(obj: Any) -> list[Any]:
            # The agent's threads only: not this test's client, nor a client-side thread
            # ("skyward-..."; a full run's pytest worker may still hold another test's pool,
            # whose heartbeat encodes a Beat now and then).
            thread = threading.current_thread()
            if thread is not client_thread and not thread.name.startswith("skyward-"):
                self.encoded.append(type(obj).__name__)
            return encode(obj)

        monkeypatch.setattr(protocol, "encode", counting)
        connection = Connection(protocol.Channel(theirs), self.slots)
        threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    @staticmethod
    def _serve(connection: Connection) -> None:
        try:
            connection.serve()
        except (protocol.ConnectionClosed, OSError):
            pass

    def results(self, count: int, timeout: float = 30) -> list[Any]:
        """Messages from the agent until ``count`` results came."""
        self.client.stream.settimeout(timeout)  # type: ignore[attr-defined]
        received: list[Any] = []
        while sum(isinstance(m, Result) for m in received) < count:
            received.extend(self.client.receive())
        return received

    def close(self) -> None:
        self.client.close()
        for worker in self.slots.workers:
            worker.kill()


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Agent]:
    started = _Agent(monkeypatch)
    yield started
    started.close()


def test_a_lone_task_and_its_result_are_never_pickled_again(agent: _Agent) -> None:
    for task_id in range(1, 4):
        agent.client.send(_call(task_id, abs, -task_id))
        (result,) = [m for m in agent.results(1) if isinstance(m, Result)]
        assert protocol.loads(result.value or b"") == task_id
    # The worker's frames went to the client as they were, the client's to the worker.
    assert agent.encoded == []


def test_output_and_results_of_a_batch_arrive_in_order(agent: _Agent) -> None:
    agent.client.send_many([_call(1, _shout, "a"), _call(2, _shout, "b")])
    received = agent.results(2)
    outputs = [m.text for m in received if isinstance(m, Output)]
    results = [(m.task_id, protocol.loads(m.value or b"")) for m in received
               if isinstance(m, Result)]
    assert "".join(outputs) == "a\nb\n"
    assert results == [(1, "A"), (2, "B")]
    assert all(isinstance(m, Output | Result | Started) for m in received)


def test_a_frame_with_a_cancel_is_pickled_for_the_worker_as_before(agent: _Agent) -> None:
    # Task 1 sleeps: task 2 waits in the worker's queue, where the cancel reaches it.
    agent.client.send_many([_call(1, time.sleep, 0.5), _call(2, abs, -2), Cancel(2),
                            _call(3, abs, -3)])
    received = agent.results(2)
    assert {m.task_id for m in received if isinstance(m, Result)} == {1, 3}
    assert "Batch" in agent.encoded  # the tasks went on without the cancel: a frame of their own


def test_a_result_nobody_waits_for_is_dropped_not_passed_on() -> None:
    routed: list[Any] = []

    class Route:
        def send_many(self, messages: list[Any]) -> None:
            routed.append(("messages", list(messages)))

        def send_frames(self, frame: list[bytes]) -> None:
            routed.append(("frame", frame))

    first, second = Route(), Route()
    frame = [b"header", b"payload"]
    a, b = Result(1), Result(2)
    relay.deliver([(first, a), (first, b)], frame, 2)
    assert routed == [("frame", frame)]
    routed.clear()
    relay.deliver([(first, a)], frame, 2)  # the other's task was cancelled: not passed on
    assert routed == [("messages", [a])]
    routed.clear()
    relay.deliver([(first, a), (second, b)], frame, 2)  # two clients: a frame each
    assert routed == [("messages", [a]), ("messages", [b])]


def test_the_frame_of_the_dispatched_tasks_is_known_only_while_they_are_dispatched() -> None:
    ours, theirs = socket.socketpair()
    tasks = [_call(1, abs, -1), _call(2, abs, -2)]
    seen: list[Any] = []

    def dispatch(messages: Any) -> None:
        seen.append((relay.frame_of(list(messages)), relay.frame_of(list(messages)[:1])))
        theirs.close()

    protocol.Channel(ours).send_many(tasks)
    with pytest.raises((protocol.ConnectionClosed, OSError)):
        relay.serve(protocol.Channel(theirs), dispatch)
    ((whole, part),) = seen
    assert part is None
    assert whole is not None
    assert [piece for piece in whole] == protocol.encode(protocol.batched(tasks))
    assert relay.frame_of(tasks) is None  # outside the dispatch


def test_plain_results_pickle_as_cloudpickle_would() -> None:
    for value in (None, True, 7, 2**80, 1.5, 2j, "é", b"\x00" * 70_000):
        result = run_task(_call(1, lambda v: v, value))
        assert result.failure is None
        assert result.value == protocol.dumps(value)
