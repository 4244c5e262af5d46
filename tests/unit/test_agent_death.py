"""A real agent process and its workers: what is left when the agent dies, what a task's exit does.

A retried task must never run beside its first attempt, so when an agent dies (SIGKILL
included) its workers and the processes their tasks started die with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skyward_iac.api.errors import RemoteError
from skyward_iac.node import protocol
from skyward_iac.node.messages import Result, Task
from skyward_iac.node.slots import Slots
from skyward_iac.remote.agent_client import AgentClient
from tests.agent_process import TOKEN, Agent, running, running_agent, wait_until


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    with running_agent(tmp_path, "--executor", "process", "--concurrency", "2") as started:
        yield started


def spawn_sleeper(pid_file: str) -> int:
    """A task that starts a child process (in the worker's group) and reports its pid."""
    child = subprocess.Popen(["sleep", "300"])
    Path(pid_file).write_text(str(child.pid))
    return os.getpid()


def exit_with(status: int) -> None:
    raise SystemExit(status)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def connect(agent: Agent) -> AgentClient:
    return AgentClient(socket.create_connection(("127.0.0.1", agent.port)), TOKEN, node=0)


def test_workers_and_their_children_die_with_a_killed_agent(agent: Agent, tmp_path: Path) -> None:
    client = connect(agent)
    pid_file = tmp_path / "sleeper.pid"
    worker = client.submit("spawn", protocol.dumps((spawn_sleeper, (str(pid_file),), {})),
                           timeout=30).result(30)
    sleeper = int(pid_file.read_text())
    assert parent_of(worker) == agent.pid and running(sleeper)

    os.kill(agent.pid, signal.SIGKILL)
    assert wait_until(lambda: not running(worker) and not running(sleeper), timeout=5), (
        f"worker {worker} or the task's child {sleeper} outlived the agent"
    )
    client.close()


def test_sys_exit_in_a_task_is_the_tasks_error_not_the_clients(agent: Agent) -> None:
    client = connect(agent)
    try:
        future = client.submit("exit", protocol.dumps((exit_with, (3,), {})), timeout=30)
        with pytest.raises(RemoteError, match="SystemExit") as raised:
            future.result(30)
        assert not isinstance(raised.value, SystemExit)
        assert "exit_with" in raised.value.remote_traceback
        # The agent still serves: the next task runs.
        assert client.submit("pow", protocol.dumps((pow, (2, 5), {})), timeout=30).result(30) == 32
    finally:
        client.close()


def test_a_worker_killed_alone_does_not_take_the_agent_down(agent: Agent) -> None:
    client = connect(agent)
    try:
        worker = client.submit("pid", protocol.dumps((os.getpid, (), {})), timeout=30).result(30)
        os.kill(worker, signal.SIGKILL)
        time.sleep(0.5)
        assert running(agent.pid)
        assert client.submit("pow", protocol.dumps((pow, (3, 2), {})), timeout=30).result(30) == 9
    finally:
        client.close()



class _Route:
    """A client connection as the slots see it: the messages sent to it."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.changed = threading.Condition()

    def send_many(self, messages: Any) -> None:
        with self.changed:
            self.messages.extend(messages)
            self.changed.notify_all()

    def results(self, count: int) -> dict[int, Any]:
        with self.changed:
            assert self.changed.wait_for(
                lambda: sum(isinstance(m, Result) for m in self.messages) >= count, 60)
            return {m.task_id: m for m in self.messages if isinstance(m, Result)}


def test_tasks_sent_to_a_dead_worker_before_its_reader_saw_it_go_on_to_its_successor() -> None:
    """The slots do not poll a worker's process before each task: tasks that reach a worker
    which died a moment ago (its reader has not handled it yet) are queued again when the
    send fails, and run on the worker that replaces it."""
    slots = Slots(1, 1, once=False, node=0)
    worker = slots.workers[0]
    gate = threading.Event()
    describe = worker.exit_description
    worker.exit_description = lambda: (gate.wait(30), describe())[1]  # type: ignore[method-assign]
    route = _Route()
    try:
        pid = worker.process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1]
                          .split()[0] == "Z", 10)  # dead, not reaped: its reader waits on gate
        tasks = [Task(n, "pow", protocol.dumps((pow, (2, n), {})), None) for n in range(4)]
        slots.submit_many(tasks, route)
        assert worker.process.returncode is None  # not polled (polling reaps)
        with slots.lock:
            assert [task.task_id for task, _ in slots.queue] == [0, 1, 2, 3]  # the send failed
        gate.set()
        results = route.results(4)
        assert {n: protocol.loads(r.value) for n, r in results.items()} == {
            n: 2 ** n for n in range(4)}
        assert slots.workers[0] is not worker
    finally:
        gate.set()
        for each in slots.workers:
            each.kill()
