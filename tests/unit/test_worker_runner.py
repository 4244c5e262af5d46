"""node/worker.py's one-slot runner, in this process over a real socket pair: what the agent
receives per task (a quiet short task's lazy ``Started`` dropped for its result, a task's
output after its ``Started`` and before its result, a line left open flushed at its end) and a coroutine run to its value."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from skyward_iac.node import protocol, read_ahead, worker
from skyward_iac.node.messages import Output, PickledFunction, Result, Started, Task
from skyward_iac.node.task_output import TaskStream


class Worker:
    """A ``Runner`` with one slot, its ``Outbox`` and task streams; the agent's end reads."""

    def __init__(self) -> None:
        self.agent, worker_end = socket.socketpair()
        self.outbox = worker.Outbox(protocol.Channel(worker_end))
        self.streams = [TaskStream("stdout", self.outbox, sys.stdout),
                        TaskStream("stderr", self.outbox, sys.stderr)]
        self.runner = worker.Runner(1, self.outbox, self.streams, None, once=False)
        self.reader = read_ahead.ReadAhead(self.agent)

    def run(self, *tasks: Task) -> list[Any]:
        """Run ``tasks`` inline; the messages the agent got, up to the last task's result."""
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.streams  # type: ignore[assignment]
        try:
            self.runner.add(list(tasks))
            self.runner.run_inline(lambda: None)
        finally:
            sys.stdout, sys.stderr = saved
        got: list[Any] = []
        while not (got and isinstance(got[-1], Result) and got[-1].task_id == tasks[-1].task_id):
            got.extend(read_ahead.receive(self.reader))
        return got


@pytest.fixture
def lone() -> Iterator[Worker]:
    w = Worker()
    yield w
    w.agent.close()


def task(task_id: int, fn: Any, *args: Any) -> Task:
    function = PickledFunction(protocol.dumps(fn))
    return Task(task_id, "t", protocol.dumps((function, args, {})), None)


def shout(text: str) -> int:
    print(text, end="")  # the line stays open: the runner sends it when the task ends
    print("!", file=sys.stderr)
    return len(text)


async def later(x: int) -> int:
    return x + 1


def test_a_quiet_short_task_sends_its_result_alone(lone: Worker) -> None:
    (result,) = lone.run(task(1, abs, -4))  # Started was superseded by the result
    assert result.task_id == 1 and protocol.loads(result.value or b"") == 4


def test_a_tasks_output_comes_before_its_result_and_an_open_line_is_flushed(
        lone: Worker) -> None:
    got = lone.run(task(2, shout, "hello"))
    assert got[0] == Started(2)  # queued before the output, so it leaves (it is not last)
    outputs = [m for m in got if isinstance(m, Output)]
    assert {(o.stream, o.text) for o in outputs} == {("stdout", "hello"), ("stderr", "!\n")}
    assert all(o.task_id == 2 for o in outputs)
    assert isinstance(got[-1], Result) and protocol.loads(got[-1].value or b"") == 5
    assert not any(stream.pending for stream in lone.streams)


def test_a_coroutine_is_run_to_its_value_and_plain_values_are_kept(lone: Worker) -> None:
    first, second = (m for m in lone.run(task(3, later, 1), task(4, str, 7))
                     if isinstance(m, Result))
    assert protocol.loads(first.value or b"") == 2 and first.failure is None
    assert protocol.loads(second.value or b"") == "7"
