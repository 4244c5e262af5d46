"""The agent's task slots: worker processes, how many tasks each may run, and recovery.

The thread executor is one worker process running ``concurrency`` tasks at once; the process
executor is ``concurrency`` processes running one task each (optionally a fresh process per
task). A worker that dies fails only its own tasks and is replaced.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from skyward_iac.api.errors import WorkerCrashedError
from skyward_iac.remote import protocol
from skyward_iac.remote.protocol import Configure, Output, Result, Task
from skyward_iac.remote.worker import describe_failure

log = logging.getLogger("skyward.agent")


class Route(Protocol):
    """Where a task's output and result go: the client connection that sent it."""

    def send(self, message: object) -> None: ...


class WorkerProcess:
    """One worker subprocess and the tasks it is running."""

    def __init__(self, once: bool, on_message: Callable[[WorkerProcess, Any], None],
                 on_exit: Callable[[WorkerProcess], None]) -> None:
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-m", "skyward_iac.remote.worker", "--fd", str(theirs.fileno())]
        self.process = subprocess.Popen(command + (["--once"] if once else []),
                                        pass_fds=(theirs.fileno(),))
        theirs.close()
        self.sock = ours
        self.send_lock = threading.Lock()
        self.running: dict[int, Task] = {}
        self.once = once
        self.accepted = 0
        self.killed = False
        self._on_message, self._on_exit = on_message, on_exit
        threading.Thread(target=self._read, daemon=True, name=f"worker-{self.process.pid}").start()

    def send(self, message: object) -> None:
        frames = protocol.encode(message)
        with self.send_lock:
            protocol.send(self.sock, frames)

    def has_room(self, per_process: int) -> bool:
        """Alive and below its task limit; a one-task worker never takes a second task."""
        if self.killed or self.process.poll() is not None or (self.once and self.accepted):
            return False
        return len(self.running) < per_process

    def kill(self) -> None:
        self.killed = True  # poll() still says alive until the kernel reaps it
        self.process.kill()

    def exit_description(self) -> str:
        code = self.process.wait()
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit code {code}"

    def _read(self) -> None:
        try:
            while True:
                self._on_message(self, protocol.read_message(self.sock))
        except (protocol.ConnectionClosed, OSError):
            pass
        self.sock.close()
        self._on_exit(self)


class Slots:
    """Admits tasks to worker processes: ``processes`` × ``per_process`` at a time."""

    def __init__(self, processes: int, per_process: int, once: bool, node: int) -> None:
        self.per_process = per_process
        self.once = once
        self.node = node
        self.lock = threading.Lock()
        self.queue: deque[tuple[Task, Route]] = deque()
        self.routes: dict[int, Route] = {}
        self.abandoned: set[int] = set()
        self.configuration: Configure | None = None
        self.workers = [self._spawn() for _ in range(processes)]

    def _spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self.once, self._on_message, self._on_exit)
        if self.configuration is not None:
            worker.send(self.configuration)
        return worker

    def configure(self, configuration: Configure) -> None:
        """Every worker, now and future, learns the node's InstanceInfo and collections."""
        with self.lock:
            self.configuration = configuration
            for worker in self.workers:
                worker.send(configuration)

    def submit(self, task: Task, route: Route) -> None:
        with self.lock:
            self.queue.append((task, route))
            self.routes[task.task_id] = route
            self._schedule()

    def cancel(self, task_id: int) -> None:
        """The client gave up on a task: drop it, and free its slot."""
        with self.lock:
            self.routes.pop(task_id, None)
            self.queue = deque((t, r) for t, r in self.queue if t.task_id != task_id)
            for worker in self.workers:
                if task_id in worker.running:
                    del worker.running[task_id]
                    self.abandoned.add(task_id)
                    if self.per_process == 1:
                        worker.kill()  # a dedicated process: stopping it is safe and frees the slot
                    self._schedule()

    def _schedule(self) -> None:
        for worker in list(self.workers):
            while self.queue and worker.has_room(self.per_process):
                task, _ = self.queue.popleft()
                worker.running[task.task_id] = task
                worker.accepted += 1
                if worker.once:
                    # Its successor starts now, so the next task never waits for a Python start.
                    self.workers.append(self._spawn())
                try:
                    worker.send(task)
                except OSError:
                    self.queue.appendleft((task, self.routes[task.task_id]))
                    del worker.running[task.task_id]
                    break

    def _on_message(self, worker: WorkerProcess, message: Any) -> None:
        task_id = message.task_id
        if isinstance(message, Output):
            route = self.routes.get(task_id)
        else:
            with self.lock:
                worker.running.pop(task_id, None)
                route = self.routes.pop(task_id, None)
                self.abandoned.discard(task_id)
                self._schedule()
        if route is not None:
            _deliver(route, message)

    def _on_exit(self, worker: WorkerProcess) -> None:
        how = worker.exit_description()
        with self.lock:
            lost = [(t, self.routes.pop(t.task_id, None)) for t in worker.running.values()]
            worker.running.clear()
            index = self.workers.index(worker)
            if worker.once and worker.accepted:
                del self.workers[index]  # its successor was started when it took its task
            else:
                self.workers[index] = self._spawn()
            self._schedule()
        for task, route in lost:
            if task.task_id in self.abandoned:
                self.abandoned.discard(task.task_id)
                continue
            log.warning("worker %s died (%s) while running %s", worker.process.pid, how, task.name)
            error = WorkerCrashedError(
                f"the worker process running {task.name} on node {self.node} died ({how}); "
                "the node keeps serving other tasks"
            )
            if route is not None:
                _deliver(route, Result(task.task_id, failure=describe_failure(error)))


def _deliver(route: Route, message: object) -> None:
    try:
        route.send(message)
    except OSError:
        log.info("client gone; dropped %s", type(message).__name__)
