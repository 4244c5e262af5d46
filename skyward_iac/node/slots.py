"""The agent's task slots: worker processes, how many tasks each may run, and recovery.

The thread executor is one worker process running ``concurrency`` tasks at once; the process
executor is ``concurrency`` processes running one task each (optionally a fresh process per
task). A worker that dies fails only the tasks it was running and is replaced.

A lone worker process (the thread executor) is also sent up to ``PREFETCH`` tasks beyond its
free slots, in one frame, so it never waits for the agent between short tasks. Which of them
had started when a worker died is read from a counter the worker shares with the agent (see
``node/worker.py``): those fail with ``WorkerCrashedError``, the others go to its successor.
Several worker processes are never sent tasks ahead: a task must not wait behind a long one
while another process is idle.

Workers die with their agent, however it dies (SIGKILL included), so a task retried elsewhere
never runs beside its first attempt: every worker holds the read end of one *lifeline* pipe
whose write end only the agent holds, and exits (with its process group's other members, see
``node/worker.py``) when it reads end-of-file there. ``PR_SET_PDEATHSIG`` was not used: it
fires when the *thread* that forked the worker ends, and workers are started from connection
and reader threads that end long before the agent does.
"""

from __future__ import annotations

import dataclasses
import logging
import mmap
import os
import signal
import socket
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from skyward_iac.api.errors import PluginError, WorkerCrashedError
from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.node import command as node_command
from skyward_iac.node import protocol, relay
from skyward_iac.node.buffer_maps import MapsSender
from skyward_iac.node.facts import network_facts
from skyward_iac.node.messages import Cancel, Configure, Result, Task
from skyward_iac.node.read_ahead import ReadAhead
from skyward_iac.node.worker import COUNTER, WORKER_INDEX_ENV, describe_failure

log = logging.getLogger("skyward.agent")

#: Tasks a lone worker process is sent beyond its free slots.
PREFETCH = 64


class Route(Protocol):
    """Where a task's output and result go: the client connection (``protocol.Channel``) that
    sent it."""

    def send_many(self, messages: Sequence[Any]) -> None: ...


#: Rewrites a worker's command: ``(argv, worker index) -> (argv, extra environment)``.
Launch = Callable[[list[str], int], tuple[list[str], dict[str, str]]]


class WorkerProcess:
    """One worker subprocess and the tasks assigned to it (running, or queued in it)."""

    def __init__(self, once: bool, slots: int, prefetch: int,
                 on_messages: Callable[[WorkerProcess, Sequence[Any], list[bytes] | None], None],
                 on_exit: Callable[[WorkerProcess], None], index: int = 0,
                 launch: Launch | None = None, lifeline: int | None = None,
                 group: int | None = None) -> None:
        # A pair each way: over one, each end's sleeping reader also woke when its peer read.
        (to_worker, worker_in), (from_worker, worker_out) = socket.socketpair(), socket.socketpair()
        # An unlinked file: the worker's counter outlives the worker, for the agent to read.
        with tempfile.TemporaryFile() as counter_file:
            counter_file.truncate(COUNTER.size)
            self.counter = mmap.mmap(counter_file.fileno(), COUNTER.size)
            command = node_command("worker", "--fd", str(worker_in.fileno()),
                                   "--out-fd", str(worker_out.fileno()), "--slots", str(slots),
                                   "--counter-fd", str(counter_file.fileno()),
                                   *(["--once"] if once else []))
            passed = [worker_in.fileno(), worker_out.fileno(), counter_file.fileno()]
            #: Where kept arguments' memfds go to the worker (node/buffer_maps.py).
            self.maps = MapsSender()
            command += ["--maps-fd", str(self.maps.worker_fd())]
            passed.append(self.maps.worker_fd())
            if lifeline is not None:
                command += ["--lifeline-fd", str(lifeline)]
                passed.append(lifeline)
            if group is not None:
                command += ["--agent-group", str(group)]
            env = {WORKER_INDEX_ENV: str(index)}
            if launch is not None:
                command, extra = launch(command, index)
                env.update(extra)
            self.process = subprocess.Popen(command, env={**os.environ, **env},
                                            pass_fds=passed)
        worker_in.close()
        worker_out.close()
        self.maps.started()
        self.channel = protocol.Channel(ReadAhead(from_worker), to_worker)  # a frame in one read
        self.to_worker = to_worker
        #: Assigned and unfinished, in assignment order: task id -> (sequence number, task).
        self.running: dict[int, tuple[int, Task]] = {}
        self.capacity = slots + prefetch
        self.once = once
        self.index = index
        self.accepted = 0
        self.killed = False
        #: Replaced before it took any task (plugins changed how workers start): no successor.
        self.retired = False
        self._on_messages, self._on_exit = on_messages, on_exit
        threading.Thread(target=self._read, daemon=True, name=f"worker-{self.process.pid}").start()

    @property
    def taken(self) -> int:
        """How many of its tasks the worker has taken from its queue (started or skipped)."""
        return COUNTER.unpack_from(self.counter, 0)[0]

    def started(self, task_id: int) -> bool:
        """Whether the worker has taken this assigned task from its queue."""
        entry = self.running.get(task_id)
        return entry is not None and entry[0] < self.taken

    def has_room(self) -> bool:
        """Not known dead, below its limit; a one-task worker never takes a second. Not polled
        (a system call a task): a dead one's tasks go on (``_schedule``, ``_on_exit``)."""
        if self.killed or self.process.returncode is not None or (self.once and self.accepted):
            return False
        return len(self.running) < self.capacity

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
                self._on_messages(self, *relay.receive_passable(self.channel))
        except (protocol.ConnectionClosed, OSError):
            pass
        except protocol.ProtocolError as exc:
            log.error("worker %s broke the protocol (%s); stopping it", self.process.pid, exc)
            self.kill()
        self.channel.close()
        ReadAhead(self.to_worker).close()  # shut down, then closed, as the channel's own
        self.maps.close()
        self._on_exit(self)


class Slots:
    """Admits tasks to worker processes: ``processes`` × ``per_process`` at a time."""

    def __init__(self, processes: int, per_process: int, once: bool, node: int,
                 group: int | None = None) -> None:
        """``group``: the agent's process group, which its workers take down with them when
        the agent dies (None: workers only stop themselves, e.g. in tests)."""
        self.per_process = per_process
        self.once = once
        self.node = node
        self.prefetch = PREFETCH if processes == 1 and not once else 0
        self.lock = threading.Lock()
        self.queue: deque[tuple[Task, Route]] = deque()
        self.routes: dict[int, Route] = {}
        self.abandoned: set[int] = set()
        self.configuration: Configure | None = None
        #: The node's plugins, from the first Configure that carries them.
        self.plugins: Any = None
        #: Why every task fails at once (a plugin's around_app failed), or None.
        self.failure: PluginError | None = None
        self.group = group
        # Never written: its end-of-file tells every worker that this process is gone. The
        # write end is not inheritable, so only this process holds it.
        self.lifeline, self._lifeline_write = os.pipe()
        self.workers = [self._spawn(index) for index in range(processes)]

    def _spawn(self, index: int) -> WorkerProcess:
        launch = self._launch if self.plugins is not None else None
        worker = WorkerProcess(self.once, self.per_process, self.prefetch, self._on_messages,
                               self._on_exit, index, launch, self.lifeline, self.group)
        if self.configuration is not None:
            worker.channel.send(self.configuration)
        return worker

    def _launch(self, argv: list[str], index: int) -> tuple[list[str], dict[str, str]]:
        from skyward_iac.api.plugin import LaunchCommand, LaunchContext

        # Only set once a Configure brought plugins, so the configuration is known.
        configuration = cast(Configure, self.configuration)
        context = LaunchContext(InstanceInfo(**configuration.instance), index)
        command = self.plugins.launch(LaunchCommand(tuple(argv)), context)
        return list(command.argv), dict(command.env)

    def configure(self, configuration: Configure) -> None:
        """Every worker, now and future, learns the node's InstanceInfo and collections.

        The first Configure carrying plugins enters their ``around_app`` here, in the agent;
        workers started before it are replaced, so they start with its environment and
        the plugins' launchers (no task has reached them yet).
        """
        instance = configuration.instance
        if "network" not in instance:  # what only the node can tell (node/facts.py)
            network = network_facts(str(instance.get("head_addr", "")))
            configuration = dataclasses.replace(configuration, instance={**instance,
                                                                         "network": network})
        with self.lock:
            self.configuration = configuration
            if (configuration.plugins is not None and self.plugins is None
                    and self.failure is None and self._start_plugins(configuration)):
                return  # the fresh workers were sent it as they started
            for worker in self.workers:
                worker.channel.send(configuration)

    def _start_plugins(self, configuration: Configure) -> bool:
        """Load the plugins and enter their ``around_app``; True when the workers were
        replaced to start under them."""
        from skyward_iac.node.plugin_hooks import NodePlugins

        try:
            self.plugins = NodePlugins.load(configuration.plugins)
            self.plugins.enter_app(InstanceInfo(**configuration.instance))
        except Exception as exc:  # noqa: BLE001 - every task of this node reports it
            log.error("plugins failed on node %s: %s", self.node, exc)
            self.failure = exc if isinstance(exc, PluginError) else PluginError(
                f"the plugins of node {self.node} could not be loaded: {exc}")
            return False
        if not self.plugins.changes_launch:
            return False
        for worker in self.workers:
            worker.retired = True
            worker.kill()
        self.workers = [self._spawn(worker.index) for worker in self.workers]
        return True

    def close_plugins(self) -> None:
        """Leave the plugins' ``around_app`` contexts (the agent is stopping)."""
        if self.plugins is not None:
            self.plugins.close()

    def submit_many(self, tasks: Sequence[Task], route: Route) -> None:
        """Queue tasks from one client connection and start what fits."""
        if self.failure is not None:
            failure = describe_failure(self.failure)
            relay.deliver([(route, Result(task.task_id, failure=failure)) for task in tasks])
            return
        with self.lock:
            for task in tasks:
                self.queue.append((task, route))
                self.routes[task.task_id] = route
            self._schedule(relay.frame_of(tasks), tasks)

    def cancel(self, task_id: int) -> None:
        """The client gave up on a task: drop it, and free its slot."""
        with self.lock:
            self.routes.pop(task_id, None)
            queued = [t for t, _ in self.queue if t.task_id == task_id]
            if queued:
                self.queue = deque((t, r) for t, r in self.queue if t.task_id != task_id)
                log.info("task %d (%s) cancelled by the client before it started",
                         task_id, queued[0].name)
            for worker in self.workers:
                if task_id not in worker.running:
                    continue
                started = worker.started(task_id)
                _, task = worker.running.pop(task_id)
                log.info("task %d (%s) cancelled by the client %s on worker %d", task_id,
                         task.name, "while running" if started else "while queued", worker.index)
                if started:  # its result (or its crash) may still come, and is dropped
                    self.abandoned.add(task_id)
                if started and self.per_process == 1:
                    worker.kill()  # a dedicated process: stopping it is safe and frees the slot
                else:
                    try:
                        worker.channel.send(Cancel(task_id))  # skipped if queued, else slot freed
                    except OSError:
                        pass
                self._schedule()

    def _schedule(self, frame: list[bytes] | None = None, tasks: Sequence[Task] = ()) -> None:
        """Send queued tasks to workers with room; ``frame``: ``tasks`` as the client sent
        them, sent on as they are to a worker that takes exactly them."""
        for worker in list(self.workers):
            batch: list[Task] = []
            while self.queue and worker.has_room():
                task, _ = self.queue.popleft()
                if task.buffers and relay.lost(task.buffers):  # its client left mid-argument
                    self.routes.pop(task.task_id, None)
                    continue
                # The worker takes its tasks in the order sent: the sequence number tells, after
                # a crash, whether its counter had reached this task.
                worker.running[task.task_id] = (worker.accepted, task)
                worker.accepted += 1
                batch.append(task)
                if worker.once:
                    # Its successor starts now, so the next task never waits for a Python start.
                    self.workers.append(self._spawn(worker.index))
            if not batch:
                continue
            try:
                if frame is not None and relay.same_objects(batch, tasks):
                    worker.channel.send_frames(frame)
                else:
                    worker.channel.send_many(worker.maps.for_worker(batch))
            except relay.SourceLost:
                self._abort_relay(worker, batch)
            except OSError:
                for task in reversed(batch):
                    del worker.running[task.task_id]
                    self.queue.appendleft((task, self.routes[task.task_id]))
                worker.accepted -= len(batch)

    def _abort_relay(self, worker: WorkerProcess, batch: list[Task]) -> None:
        """A client left while its argument was being forwarded to ``worker``, which now holds
        half a frame: stop it (its tasks fail or move on as after any crash), drop the tasks
        that can never be whole, and queue the others again."""
        log.warning("a client left mid-argument; stopping worker %d, which got part of it",
                    worker.index)
        worker.kill()
        for task in reversed(batch):
            del worker.running[task.task_id]
            route = self.routes.get(task.task_id)
            if relay.lost(task.buffers):
                self.routes.pop(task.task_id, None)
            elif route is not None:
                self.queue.appendleft((task, route))
        worker.accepted -= len(batch)

    def _on_messages(self, worker: WorkerProcess, messages: Sequence[Any],
                     frame: list[bytes] | None = None) -> None:
        """A frame of ``worker``'s messages (``frame``: as sent, see relay.receive_passable)."""
        deliveries: list[tuple[Route, Any]] = []
        with self.lock:
            finished = False
            for message in messages:
                task_id = message.task_id
                if not isinstance(message, Result):  # Output, Started: the task runs on
                    route = self.routes.get(task_id)
                else:
                    entry = worker.running.pop(task_id, None)
                    route = self.routes.pop(task_id, None)
                    self.abandoned.discard(task_id)
                    finished = True
                    if message.failure is not None:
                        log.info("task %d (%s) failed on worker %d: %s: %s", task_id,
                                 entry[1].name if entry is not None else "?", worker.index,
                                 message.failure.type_name, message.failure.message)
                if route is not None:
                    deliveries.append((route, message))
            if finished and self.queue:  # a slot is free for what waits
                self._schedule()
        relay.deliver(deliveries, frame, len(messages))

    def _on_exit(self, worker: WorkerProcess) -> None:
        if worker.retired:
            worker.process.wait()
            worker.counter.close()
            return
        how = worker.exit_description()
        taken = worker.taken
        with self.lock:
            lost: list[tuple[Task, Route | None]] = []
            unstarted: list[Task] = []
            for sequence, task in worker.running.values():
                if sequence < taken:
                    lost.append((task, self.routes.pop(task.task_id, None)))
                else:
                    unstarted.append(task)
            worker.running.clear()
            # Tasks it never took from its queue go first to its successor, in their order.
            for task in reversed(unstarted):
                route = self.routes.get(task.task_id)
                if route is not None:
                    self.queue.appendleft((task, route))
            index = self.workers.index(worker)
            if worker.once and worker.accepted:
                del self.workers[index]  # its successor was started when it took its task
            else:
                self.workers[index] = self._spawn(worker.index)
            self._schedule()
        worker.counter.close()
        deliveries: list[tuple[Route, Any]] = []
        for task, route in lost:
            if task.task_id in self.abandoned:
                self.abandoned.discard(task.task_id)
                continue
            log.warning("task %d (%s) failed on worker %d: its process %s died (%s)",
                        task.task_id, task.name, worker.index, worker.process.pid, how)
            error = WorkerCrashedError(
                f"the worker process running {task.name} on node {self.node} died ({how}); "
                "the node keeps serving other tasks"
            )
            if route is not None:
                deliveries.append((route, Result(task.task_id, failure=describe_failure(error))))
        relay.deliver(deliveries)
