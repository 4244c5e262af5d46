"""A worker process on a node: runs the tasks its agent hands it and streams their output.

Started by the agent as ``python -m skyward_iac.remote.worker --fd N [--once]`` with one end of
a socket pair. Tasks run in threads; the agent decides how many run at once. If a task kills
this process (``os._exit``, a signal, the OOM killer) only this process dies: the agent reports
the task as failed and starts a new worker.
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, TextIO

import cloudpickle

from skyward_iac.api.runtime import InstanceInfo, bind_instance
from skyward_iac.remote import protocol
from skyward_iac.remote.protocol import Configure, Failure, Output, Result, Task

current_task: ContextVar[int | None] = ContextVar("skyward_current_task", default=None)


def describe_failure(exc: BaseException) -> Failure:
    """Capture an exception for the client: pickled when possible, always with its traceback."""
    try:
        pickled: bytes | None = protocol.dumps(exc)
        cloudpickle.loads(pickled)  # some exceptions pickle but cannot be rebuilt
    except Exception:
        pickled = None
    kind = type(exc)
    return Failure(
        type_name=f"{kind.__module__}.{kind.__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
        exception=pickled,
    )


def run_task(task: Task) -> Result:
    """Unpickle and call a task's function; never raises."""
    try:
        fn, args, kwargs = cloudpickle.loads(task.payload)
        value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the client
        return Result(task.task_id, failure=describe_failure(exc))
    try:
        return Result(task.task_id, value=protocol.dumps(value))
    except Exception as exc:
        wrapped = TypeError(f"the result of {task.name} cannot be pickled: {exc}")
        return Result(task.task_id, failure=describe_failure(wrapped))


class Channel:
    """The socket to the agent, shared by task threads."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.lock = threading.Lock()

    def send(self, message: object) -> None:
        frames = protocol.encode(message)
        with self.lock:
            protocol.send(self.sock, frames)


class TaskStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a worker: text written by a task goes to the client,
    line by line, tagged with the task; anything else goes to the original stream (the log)."""

    def __init__(self, name: str, channel: Channel, fallback: TextIO) -> None:
        self.name = name
        self.channel = channel
        self.fallback = fallback
        self.pending: dict[int, str] = {}
        self.lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        task_id = current_task.get()
        if task_id is None:
            return self.fallback.write(text)
        with self.lock:
            buffered = self.pending.get(task_id, "") + text
            head, newline, tail = buffered.rpartition("\n")
            self.pending[task_id] = tail
        if newline:
            self.channel.send(Output(task_id, self.name, head + newline))
        return len(text)

    def flush_task(self, task_id: int) -> None:
        """Send what a finished task left without a newline."""
        with self.lock:
            rest = self.pending.pop(task_id, "")
        if rest:
            self.channel.send(Output(task_id, self.name, rest))

    def flush(self) -> None:
        self.fallback.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--once", action="store_true", help="exit after one task")
    args = parser.parse_args(argv)

    channel = Channel(socket.socket(fileno=args.fd))
    streams = [TaskStream("stdout", channel, sys.stdout), TaskStream("stderr", channel, sys.stderr)]
    sys.stdout, sys.stderr = streams  # type: ignore[assignment]
    # The agent admits tasks; this pool only needs room for them (and for abandoned ones).
    threads = ThreadPoolExecutor(max_workers=64, thread_name_prefix="task")

    def execute(task: Task) -> None:
        current_task.set(task.task_id)
        result = run_task(task)
        for stream in streams:
            stream.flush_task(task.task_id)
        channel.send(result)
        if args.once:
            os._exit(0)

    while True:
        try:
            message: Any = protocol.read_message(channel.sock)
        except (protocol.ConnectionClosed, OSError):
            os._exit(0)  # the agent is gone
        if isinstance(message, Configure):
            bind_instance(InstanceInfo(**message.instance))
            if message.collections is not None:
                # Imported only here: the etcd client (gRPC) is not needed without collections.
                from skyward_iac.collections import connect, set_process_default

                set_process_default(connect(message.collections))
        elif isinstance(message, Task):
            threads.submit(execute, message)


if __name__ == "__main__":
    main()
