"""A task's stdout and stderr inside a worker: what a task prints goes to the client, line by
line, tagged with the task (``TaskStream``), and everything else to the worker's own log."""

from __future__ import annotations

import io
import threading
from contextvars import ContextVar
from typing import TYPE_CHECKING, TextIO

from skyward_iac.node.messages import Output

if TYPE_CHECKING:
    from skyward_iac.node.worker import Outbox

#: The task the running thread works for (set in each task's own context copy).
current_task: ContextVar[int | None] = ContextVar("skyward_current_task", default=None)


class TaskStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` of a worker: text written by a task goes to the client,
    line by line, tagged with the task; anything else goes to the original stream (the log)."""

    def __init__(self, name: str, outbox: Outbox, fallback: TextIO) -> None:
        self.name = name
        self.outbox = outbox
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
            self.outbox.send(Output(task_id, self.name, head + newline), urgent=False)
        return len(text)

    def flush_task(self, task_id: int) -> None:
        """Send what a finished task left without a newline."""
        if task_id not in self.pending:  # it printed nothing (a lock per task saved)
            return
        with self.lock:
            rest = self.pending.pop(task_id, "")
        if rest:
            self.outbox.send(Output(task_id, self.name, rest), urgent=False)

    def flush(self) -> None:
        self.fallback.flush()
