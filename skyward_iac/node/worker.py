"""A worker process on a node: runs the tasks its agent hands it and streams their output.

Started by the agent as ``python -m skyward_iac.node worker --fd N --out-fd M [--slots K]
[--counter-fd C] [--once]``: the agent's frames arrive on ``N``, its own go out on ``M`` (one
socket pair each way, see ``slots.WorkerProcess``). ``K`` runner threads take tasks from
a local FIFO queue (the agent may send tasks ahead of free slots, so a busy worker never waits
for its agent between short tasks). Before a task starts, the count of tasks taken from the
queue is written to the shared counter ``C``: if a task kills this process (``os._exit``, a
signal, the OOM killer), the agent reads it to tell the tasks that were running (they failed)
from those that never started (they go to the next worker). Results of a busy worker go back in
batches, at most ``Outbox.MAX_DELAY`` late.
"""

from __future__ import annotations

import argparse
import contextvars
import mmap
import os
import pickle
import select
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from skyward_iac.api.function import settle
from skyward_iac.api.runtime import InstanceInfo, bind_instance, route_output
from skyward_iac.node import protocol, read_ahead
from skyward_iac.node.buffer_maps import Lease, MapsReceiver
from skyward_iac.node.lifeline import agent_gone, watch_lifeline
from skyward_iac.node.messages import Cancel, Configure, Failure, Result, Started, Task
from skyward_iac.node.protocol import Channel
from skyward_iac.node.task_output import TaskStream, current_task

#: The shared counter's layout: tasks taken from the queue so far (started or skipped).
COUNTER = struct.Struct("Q")
#: The environment variable giving a worker process its index on the node (set by the agent).
WORKER_INDEX_ENV = "SKYWARD_WORKER_INDEX"
#: Values of these exact types pickle the same with ``pickle`` as with cloudpickle, faster.
_PLAIN = frozenset({type(None), bool, int, float, complex, str, bytes})
#: This process's plugins (a ``plugins._node.NodePlugins``) once a Configure brought some.
process_plugins: Any = None

def describe_failure(exc: BaseException) -> Failure:
    """Capture an exception for the client: pickled when possible, always with its traceback.

    A ``BaseException`` that is not an ``Exception`` (``SystemExit`` from ``sys.exit``,
    ``KeyboardInterrupt``, ``GeneratorExit``) ends only the task: it is never pickled, so the
    client gets a ``RemoteError`` naming it instead of an exit of its own.
    """
    kind = type(exc)
    pickled: bytes | None = None
    message = str(exc)
    if isinstance(exc, Exception):
        try:
            dumped = protocol.dumps(exc)
            protocol.loads(dumped)  # some exceptions pickle but cannot be rebuilt
            pickled = dumped
        except Exception:
            pickled = None
    else:
        message = f"the task raised {exc!r}"
    return Failure(
        type_name=f"{kind.__module__}.{kind.__qualname__}",
        message=message,
        traceback="".join(traceback.format_exception(exc)),
        exception=pickled,
    )


def run_task(task: Task) -> Result:
    """Unpickle and call a task's function; never raises. A handed-over argument is mapped for
    the call alone (node/buffer_maps.py); the result says when nothing refers to it after."""
    started = time.perf_counter()
    try:
        if not task.buffers:  # most tasks: nothing to map
            return _call(task, (), started)
        lease = Lease(task.buffers)
        with lease as buffers:
            result = _call(task, buffers, started)  # its frame, and references, end here
        if not lease.let_go:
            return result
        return Result(result.task_id, result.value, result.failure, result.buffers,
                      result.duration, let_go=True)
    except BaseException as exc:  # noqa: BLE001 - mapping it failed: the task fails
        return Result(task.task_id, failure=describe_failure(exc),
                      duration=time.perf_counter() - started)


def _call(task: Task, arguments: Sequence[Any], started: float) -> Result:
    try:
        fn, args, kwargs = protocol.loads(task.payload, arguments)
        if process_plugins is not None:
            fn = process_plugins.decorate(fn)
        value = fn(*args, **kwargs)
        if type(value) not in _PLAIN:
            # A coroutine (a function that hides its ``async def`` from ``@sky.function``)
            # runs here.
            value = settle(value)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the client
        return Result(task.task_id, failure=describe_failure(exc),
                      duration=time.perf_counter() - started)
    duration = time.perf_counter() - started
    try:
        if type(value) in _PLAIN:  # the same bytes as cloudpickle's, without its pickler's set-up
            return Result(task.task_id, value=pickle.dumps(value, protocol=5), duration=duration)
        payload, buffers = protocol.dumps_with_buffers(value)
        return Result(task.task_id, value=payload, buffers=buffers, duration=duration)
    except Exception as exc:
        wrapped = TypeError(f"the result of {task.name} cannot be pickled: {exc}")
        return Result(task.task_id, failure=describe_failure(wrapped), duration=duration)


class Outbox:
    """Messages for the agent, in order. An urgent message goes at once with everything queued
    before it; others wait up to ``MAX_DELAY`` (or until ``MAX_BATCH``) to share a frame. A lazy
    message (``wake=False``) does not wake the sending thread: it leaves with the next frame, at
    most ``LAZY_DELAY`` later."""

    MAX_BATCH = 256
    MAX_DELAY = 0.001
    LAZY_DELAY = 0.1

    def __init__(self, channel: Channel, on_gone: Callable[[], Any] = lambda: os._exit(0)) -> None:
        """``on_gone``: what to do when a send fails (the agent is gone); it must not return."""
        self.channel = channel
        self.on_gone = on_gone
        # A plain lock under the condition, taken directly where nothing waits: every task
        # takes it twice, and a Condition's own ``with`` is a Python-level call around an RLock.
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.items: list[Any] = []
        self.first_at = 0.0
        self.wakeup_pending = False
        # Held from taking a batch to finishing its send, so batches leave in the order taken.
        self.send_lock = threading.Lock()
        threading.Thread(target=self._flush_late, name="outbox", daemon=True).start()

    def send(self, message: object, urgent: bool = True, supersedes: object = None,
             wake: bool = True) -> None:
        """Queue ``message``; ``supersedes`` is dropped if it is the last message still queued
        (a task's ``Started`` when its ``Result`` follows it at once: the result says both)."""
        with self.lock:
            if supersedes is not None and self.items and self.items[-1] is supersedes:
                self.items.pop()
            self.items.append(message)
            if not urgent and len(self.items) < self.MAX_BATCH:
                if len(self.items) == 1:
                    self.first_at = time.monotonic()
                if wake and not self.wakeup_pending:
                    # Waking the sender costs a thread switch on the task's CPU: once per frame.
                    self.wakeup_pending = True
                    self.cond.notify()
                return
            self._take_and_send()

    def _take_and_send(self) -> None:
        # Called with ``lock`` held; releases it before the write.
        items, self.items = self.items, []
        self.wakeup_pending = False
        self.send_lock.acquire()
        self.lock.release()
        try:
            self.channel.send_many(items)
        finally:
            self.send_lock.release()
            self.lock.acquire()

    def _flush_late(self) -> None:
        with self.cond:
            while True:
                if not self.items:
                    self.cond.wait(self.LAZY_DELAY)  # lazy messages queued meanwhile leave then
                    continue
                late = self.first_at + self.MAX_DELAY - time.monotonic()
                if late > 0:
                    self.cond.wait(late)
                    continue
                try:
                    self._take_and_send()
                except OSError:
                    self.on_gone()  # the agent is gone


class Runner:
    """Runs queued tasks in FIFO order: ``slots`` threads, or, with one slot, the thread that
    reads the agent's frames (``inline``): a lone task then starts with no thread hand-off."""

    def __init__(self, slots: int, outbox: Outbox, streams: list[TaskStream],
                 counter: mmap.mmap | None, once: bool,
                 after_result: Callable[[], Any] | None = None) -> None:
        self.slots = slots
        #: Called once a task's result is handed to the outbox (``MapsReceiver.settle``).
        self.after_result = after_result
        self.inline = slots == 1
        self.outbox = outbox
        self.streams = streams
        self.counter = counter
        self.once = once
        self.lock = threading.Lock()  # taken directly where nothing waits (see Outbox)
        self.cond = threading.Condition(self.lock)
        self.queue: deque[Task] = deque()
        self.taken = 0
        self.running: set[int] = set()
        self.cancelled: set[int] = set()
        self.abandoned: set[int] = set()
        self.threads = 0

    def add(self, tasks: list[Task]) -> None:
        """Queue tasks (inline, ``run_inline`` runs them)."""
        with self.lock:
            self.queue.extend(tasks)
            if not self.inline:
                self._start_threads()
                self.cond.notify(len(tasks))

    def run_inline(self, between: Callable[[], None]) -> None:
        """Inline only: run queued tasks until none is left, calling ``between`` after each
        that left others queued (it reads frames that arrived meanwhile, so a cancel reaches
        tasks still queued; with none queued the caller's next read gets those frames, and a
        lone task costs no ``select``)."""
        # Only this thread adds to the queue (``add``, from ``between``): it is read unlocked.
        while self.queue and (task := self._next(wait=False)) is not None:
            self._execute(task)
            if self.queue:
                between()

    def cancel(self, task_id: int) -> None:
        """A queued task is skipped; a running one keeps its thread, and another thread takes
        its slot (Python cannot stop a thread)."""
        with self.lock:
            if task_id in self.running:
                self.running.discard(task_id)
                self.abandoned.add(task_id)
                self._start_threads()
            elif any(task.task_id == task_id for task in self.queue):
                self.cancelled.add(task_id)

    def _start_threads(self) -> None:
        while self.threads < self.slots + len(self.abandoned):
            self.threads += 1
            threading.Thread(target=self._loop, name="task", daemon=True).start()

    def _loop(self) -> None:
        while True:
            task = self._next(wait=True)
            if task is not None and self._execute(task):
                return  # another thread took this slot when the task was abandoned

    def _next(self, wait: bool) -> Task | None:
        """The next task to run, counted as taken before it starts; cancelled ones are
        skipped (and counted too, so the count stays a prefix of the agent's order)."""
        with self.lock:
            while True:
                if not self.queue:
                    if not wait:
                        return None
                    self.cond.wait()
                    continue
                task = self.queue.popleft()
                self.taken += 1
                if self.counter is not None:
                    COUNTER.pack_into(self.counter, 0, self.taken)
                if task.task_id in self.cancelled:
                    self.cancelled.discard(task.task_id)
                    continue
                self.running.add(task.task_id)
                return task

    def _execute(self, task: Task) -> bool:
        """Run one task and send its result; True when this thread should retire."""
        # Lazy, and dropped if the result follows before it left (a short task's result tells
        # the client both): a long task is reported started at most LAZY_DELAY after.
        started = Started(task.task_id)
        self.outbox.send(started, urgent=False, wake=False)
        result = contextvars.copy_context().run(_run_as_current, task)
        for stream in self.streams:
            if stream.pending:  # it printed something (most tasks do not)
                stream.flush_task(task.task_id)
        with self.lock:
            self.running.discard(task.task_id)
            retire = task.task_id in self.abandoned
            self.abandoned.discard(task.task_id)
            idle = not self.queue
            if retire:
                self.threads -= 1
        # A busy worker's results share frames; the last one before going idle goes at once.
        self.outbox.send(result, urgent=idle or self.once, supersedes=started)
        if self.once:
            os._exit(0)
        if self.after_result is not None and task.buffers:
            self.after_result()
        return retire


def _run_as_current(task: Task) -> Result:
    current_task.set(task.task_id)  # in the task's own context copy: no reset needed
    return run_task(task)


def _instance(message: Configure) -> InstanceInfo:
    """The node's InstanceInfo as this worker process sees it (its index among several
    workers per node comes from the agent)."""
    fields = dict(message.instance)
    if fields.get("workers_per_node", 1) > 1:
        fields["worker"] = int(os.environ.get(WORKER_INDEX_ENV, "0"))
    return InstanceInfo(**fields)


def _start_plugins(pickled: bytes, instance: InstanceInfo) -> None:
    """Once per process, before any task: the plugins' ``around_process`` and decorators."""
    global process_plugins
    if process_plugins is None:
        from skyward_iac.node.plugin_hooks import start_in_process

        process_plugins = start_in_process(pickled, instance)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m skyward_iac.node worker", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the agent's frames come here")
    parser.add_argument("--out-fd", type=int, help="frames for the agent go here (default: --fd)")
    parser.add_argument("--slots", type=int, default=1, help="tasks running at once")
    parser.add_argument("--counter-fd", type=int, help="shared counter of tasks taken")
    parser.add_argument("--once", action="store_true", help="exit after one task")
    parser.add_argument("--lifeline-fd", type=int, help="end-of-file here: the agent is gone")
    parser.add_argument("--agent-group", type=int, help="the agent's process group")
    parser.add_argument("--maps-fd", type=int, help="kept arguments' memfds come here")
    args = parser.parse_args(argv)

    if args.lifeline_fd is not None:
        watch_lifeline(args.lifeline_fd, args.agent_group)
    sock = socket.socket(fileno=args.fd)
    stream = read_ahead.ReadAhead(sock)  # a task's frame in one read
    channel = Channel(stream, sock if args.out_fd is None else socket.socket(fileno=args.out_fd))
    outbox = Outbox(channel, on_gone=lambda: agent_gone(args.agent_group))
    streams = [TaskStream("stdout", outbox, sys.stdout), TaskStream("stderr", outbox, sys.stderr)]
    sys.stdout, sys.stderr = streams  # type: ignore[assignment]
    route_output()  # @sky.silent, @sky.stdout, redirect_output: per task, over the task streams
    counter = None
    if args.counter_fd is not None:
        counter = mmap.mmap(args.counter_fd, COUNTER.size)
    maps = MapsReceiver(args.maps_fd) if args.maps_fd is not None else None
    runner = Runner(args.slots, outbox, streams, counter, args.once,
                    maps.settle if maps is not None else None)

    def receive() -> None:
        try:
            messages = read_ahead.receive(stream)
        except (protocol.ConnectionClosed, OSError, protocol.ProtocolError):
            agent_gone(args.agent_group)  # whichever notices first: this or the lifeline
        tasks = []
        for message in messages:
            if isinstance(message, Task):
                tasks.append(maps.resolve(message) if maps is not None and message.buffers
                             else message)
            elif isinstance(message, Cancel):
                if tasks:  # a cancel must see the tasks sent before it
                    runner.add(tasks)
                    tasks = []
                runner.cancel(message.task_id)
            elif isinstance(message, Configure):
                instance = _instance(message)
                bind_instance(instance)
                if message.collections is not None:
                    # Imported only here: the etcd client (gRPC) is not needed without collections.
                    from skyward_iac.collections import connect, set_process_default

                    set_process_default(connect(message.collections))
                if message.plugins is not None:
                    _start_plugins(message.plugins, instance)
        if tasks:
            runner.add(tasks)

    def receive_pending() -> None:
        while stream.pending() or select.select([sock], [], [], 0)[0]:
            receive()

    while True:
        receive()
        if runner.inline:
            runner.run_inline(receive_pending)

