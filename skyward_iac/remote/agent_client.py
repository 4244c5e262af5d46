"""The client's end of one node's agent connection: submit tasks, get futures back.

A reader thread resolves futures as results arrive; a deadline thread fails tasks that exceed
their timeout (``TimeoutError`` naming the function and limit) and tells the agent to drop them.
``submit_many`` sends several tasks in one frame (the pool batches what it has queued).

A task sent and not finished is *pending* here and belongs to this client. When the connection
breaks (the reader sees it end, or a send fails), every pending task is taken exactly once and
handed to ``on_lost``; the client never retries anything itself: the pool decides.
"""

from __future__ import annotations

import contextvars
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from skyward_iac.api.errors import NodeConnectionError, RemoteError, SkywardError
from skyward_iac.node import protocol
from skyward_iac.node.messages import (
    Cancel,
    Configure,
    Failure,
    MetricSamples,
    Output,
    PreemptionNotice,
    Result,
    Started,
    Task,
    Welcome,
)
from skyward_iac.node.protocol import ByteStream
from skyward_iac.remote.pacing import Pace

#: Called with the node index, the tasks that were pending when its connection broke, and why.
OnLost = Callable[[int, list["Submission"], str], Any]


@dataclass(eq=False)
class Submission:
    """One task to send: its id (the same on the wire, in events and in the agent's log), its
    pickled call (and out-of-band buffers) and the future to resolve."""

    task_id: int
    name: str
    payload: bytes
    timeout: float | None
    buffers: tuple[Any, ...] = ()
    future: Future[Any] = field(default_factory=Future)
    #: Set once a worker on the node has started it (at the latest with its result).
    started: bool = False
    #: Seconds the function ran on the node, set before ``future`` resolves with its result;
    #: for a task failed here (timed out, node lost), the seconds since it was sent.
    duration: float | None = None
    #: Where the task's output is written (a Jupyter kernel's cell; see orchestration/notebook).
    context: contextvars.Context | None = None
    #: When it was sent (monotonic), and whether nothing else was pending on the node then.
    sent_at: float = 0.0
    sent_idle: bool = False


class AgentClient:
    """A multiplexed task connection to one node's agent."""

    def __init__(self, stream: ByteStream, token: str, node: int, *,
                 ids: Iterator[int] | None = None,
                 on_output: Callable[[int, str, str], Any] | None = None,
                 on_lost: OnLost | None = None) -> None:
        self.node = node
        self._ids = ids or itertools.count(1)
        self._on_output = on_output
        #: Called once per broken connection with the tasks it had pending (see module doc).
        self.on_lost = on_lost
        #: Called after each frame of results is resolved (the pool's dispatcher waits on it).
        self.on_results: Callable[[], Any] | None = None
        #: Called with the node index and a submission when a worker starts it.
        self.on_started: Callable[[int, Submission], Any] | None = None
        #: Called with the node index and each batch of the agent's metric samples.
        self.on_metrics: Callable[[int, tuple[Any, ...]], Any] | None = None
        #: Called with the node index and the notice when its cloud announces its preemption.
        self.on_preemption: Callable[[int, PreemptionNotice], Any] | None = None
        self._channel = protocol.Channel(stream)
        #: The node's measured round-trip overhead and task run time (``Worker(buffer="auto")``).
        self.pace = Pace()
        self._pending: dict[int, Submission] = {}
        self._pending_lock = threading.Lock()
        self._deadlines: list[tuple[float, int, float]] = []
        self._deadline_wakeup = threading.Condition()
        self._closed = False
        self.welcome = self._handshake(token)
        threading.Thread(target=self._read_results, name=f"agent-{node}-reader", daemon=True).start()
        threading.Thread(target=self._expire_deadlines, name=f"agent-{node}-deadlines",
                         daemon=True).start()

    def _handshake(self, token: str) -> Welcome:
        """Send the token; the agent's ``Welcome``, refused when it speaks another protocol."""
        self._channel.send_raw(token.encode())
        greeting = self._channel.receive()
        welcome = greeting[0] if len(greeting) == 1 else greeting
        if not isinstance(welcome, Welcome):
            raise NodeConnectionError(f"node {self.node}: unexpected agent greeting {welcome!r}")
        version = getattr(welcome, "protocol", 1)
        if version != protocol.PROTOCOL_VERSION:
            self._channel.close()
            raise NodeConnectionError(
                f"node {self.node}: its agent speaks protocol {version}, this client "
                f"{protocol.PROTOCOL_VERSION}; install the same skyward_iac version on both sides"
            )
        return welcome

    @property
    def in_flight(self) -> int:
        """Tasks sent and not finished yet."""
        return len(self._pending)

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by us or by the peer)."""
        return self._closed

    def configure(self, instance: dict[str, Any], collections: Any = None,
                  plugins: bytes | None = None) -> None:
        """Tell the agent, before any task, the node's ``InstanceInfo`` (as a dict), the
        ``collections.BackendConfig`` its tasks use (None: no collections) and the pool's
        pickled node-side plugins (None: none)."""
        self.send(Configure(instance, collections, plugins))

    def send(self, message: object) -> None:
        """Send one control message (not a task) in a frame of its own; ``OSError`` when the
        connection is broken (the reader hands the pending tasks to ``on_lost``)."""
        self._channel.send(message)

    def submit(self, name: str, payload: bytes, timeout: float | None,
               buffers: tuple[Any, ...] = ()) -> Future[Any]:
        """Send one task (``payload`` = pickled ``(fn, args, kwargs)``); returns its future.
        Used for work outside the pool's queue (health probes); lost ones just fail."""
        submission = Submission(next(self._ids), name, payload, timeout, buffers)
        submission.future.set_running_or_notify_cancel()
        self.submit_many([submission])
        return submission.future

    def submit_many(self, submissions: list[Submission]) -> None:
        """Send several tasks in one frame; each ``future`` resolves with its task's outcome
        (a future already cancelled is skipped).

        ``NodeConnectionError`` when the connection is already closed (then nothing was
        taken). A send that fails breaks the connection: the tasks it had taken go to
        ``on_lost`` like any other pending task.
        """
        tasks = []
        with self._pending_lock:
            # Checked under the lock that closing takes: a task added here is always either
            # resolved or handed back by whoever closes the connection.
            if self._closed:
                raise NodeConnectionError(f"node {self.node}: connection is closed")
            now = time.monotonic()
            for submission in submissions:
                if submission.future.cancelled():
                    continue
                submission.sent_at, submission.sent_idle = now, not self._pending
                self._pending[submission.task_id] = submission
                self.pace.sent(submission.name)
                tasks.append(Task(submission.task_id, submission.name, submission.payload,
                                  submission.timeout, submission.buffers))
        if not tasks:
            return
        self._add_deadlines(tasks)
        try:
            self._channel.send_many(tasks)
        except OSError as exc:
            names = ", ".join(sorted({s.name for s in submissions}))
            self._broken(f"sending {names} failed: {exc}")

    def _add_deadlines(self, tasks: list[Task]) -> None:
        now = time.monotonic()
        deadlines = [(now + t.timeout, t.task_id, t.timeout) for t in tasks if t.timeout is not None]
        if not deadlines:
            return
        with self._deadline_wakeup:
            if len(self._deadlines) > 2 * len(self._pending) + 4096:
                # Deadlines of finished tasks linger until they pass: drop them in bulk.
                self._deadlines = [d for d in self._deadlines if d[1] in self._pending]
                heapq.heapify(self._deadlines)
            earliest_before = self._deadlines[0][0] if self._deadlines else None
            for deadline in deadlines:
                heapq.heappush(self._deadlines, deadline)
            # The deadline thread sleeps until the earliest deadline: wake it only if that moved.
            if earliest_before is None or self._deadlines[0][0] < earliest_before:
                self._deadline_wakeup.notify()

    def close(self) -> list[Submission]:
        """Close the connection; returns the tasks still pending (unresolved: the caller
        decides what becomes of them). ``on_lost`` is not called for a close."""
        taken = self._shut()
        self._channel.close()
        return taken or []

    def _shut(self) -> list[Submission] | None:
        """Mark the connection closed and take every pending task; None when it was closed
        already (the first closer takes them all)."""
        with self._pending_lock:
            if self._closed:
                return None
            self._closed = True
            taken, self._pending = list(self._pending.values()), {}
            self.pace.holding.clear()
        with self._deadline_wakeup:
            self._deadline_wakeup.notify()
        return taken

    def _take(self, task_id: int) -> Submission | None:
        with self._pending_lock:
            taken = self._pending.pop(task_id, None)
            if taken is not None:
                self.pace.finished(taken.name)
            return taken

    def _broken(self, reason: str) -> None:
        """The connection is unusable: close it and hand every pending task to ``on_lost``
        (once per task, whichever thread notices first)."""
        lost = self._shut()
        if lost is None:
            return
        try:
            self._channel.close()
        except OSError:
            pass
        if self.on_lost is not None:
            self.on_lost(self.node, lost, reason)
        else:
            fail(lost, NodeConnectionError(f"node {self.node}: {reason}"))

    def _read_results(self) -> None:
        try:
            while True:
                resolved = False
                for message in self._channel.receive():
                    if isinstance(message, Result):
                        self._resolve(message)
                        resolved = True
                    elif isinstance(message, Started):
                        started = self._pending.get(message.task_id)
                        if started is not None:
                            self._started(started)
                    elif isinstance(message, Output) and self._on_output is not None:
                        self._output(message)
                    elif isinstance(message, MetricSamples) and self.on_metrics is not None:
                        self.on_metrics(self.node, message.samples)
                    elif isinstance(message, PreemptionNotice) and self.on_preemption is not None:
                        self.on_preemption(self.node, message)
                if resolved and self.on_results is not None:
                    self.on_results()
        except (protocol.ConnectionClosed, OSError, EOFError) as exc:
            self._broken(f"agent connection lost: {exc}")
        except protocol.ProtocolError as exc:
            self._broken(f"the agent broke the protocol: {exc}")

    def _output(self, message: Output) -> None:
        assert self._on_output is not None
        entry = self._pending.get(message.task_id)
        if entry is not None and entry.context is not None:
            # Under the cell that submitted the task, in a notebook.
            entry.context.run(self._on_output, self.node, message.stream, message.text)
        else:
            self._on_output(self.node, message.stream, message.text)

    def _resolve(self, result: Result) -> None:
        entry = self._take(result.task_id)
        if entry is None:
            return  # timed out already
        self.pace.record(entry.name, elapsed=time.monotonic() - entry.sent_at,
                         duration=result.duration, sent_idle=entry.sent_idle)
        future, name = entry.future, entry.name
        if future.done():
            return  # cancelled by its caller
        entry.duration = result.duration
        self._started(entry)  # a short task's Started travels as its Result
        outcome: BaseException | None = None
        value: Any = None
        if result.failure is not None:
            outcome = rebuild_exception(result.failure, self.node)
        else:
            try:
                value = protocol.loads(result.value or b"", result.buffers)
            except ModuleNotFoundError as exc:
                outcome = SkywardError(
                    f"the result of {name} from node {self.node} needs module {exc.name!r}, "
                    f"which is not installed on this client: install it here to receive this "
                    f"result"
                )
            except Exception as exc:
                outcome = SkywardError(
                    f"the result of {name} from node {self.node} cannot be unpickled here: "
                    f"{exc!r}"
                )
        try:
            if outcome is None:
                future.set_result(value)
            else:
                future.set_exception(outcome)
        except InvalidStateError:
            pass  # cancelled meanwhile

    def _started(self, submission: Submission) -> None:
        if not submission.started:
            submission.started = True
            if self.on_started is not None:
                self.on_started(self.node, submission)

    def _expire_deadlines(self) -> None:
        while not self._closed:
            with self._deadline_wakeup:
                while not self._closed and (
                    not self._deadlines or self._deadlines[0][0] > time.monotonic()
                ):
                    wait = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
                    self._deadline_wakeup.wait(wait)
                if self._closed:
                    return
                _, task_id, limit = heapq.heappop(self._deadlines)
            entry = self._take(task_id)
            if entry is None:
                continue
            fail([entry], TimeoutError(
                f"{entry.name} did not finish within its timeout of {limit:g}s on node "
                f"{self.node} (task {task_id})"))
            try:
                self._channel.send(Cancel(task_id))
            except OSError:
                pass


def fail(submissions: list[Submission], error: BaseException) -> None:
    """Resolve every unfinished future of ``submissions`` with ``error`` (cancelled and
    finished ones are left as they are). A task that was sent is given the time since then
    as its duration (on this client's clock), so its failure says how long it was out."""
    now = time.monotonic()
    for submission in submissions:
        if submission.duration is None and submission.sent_at and not submission.future.done():
            submission.duration = now - submission.sent_at
        try:
            submission.future.set_exception(error)
        except InvalidStateError:
            pass  # already done or cancelled


def rebuild_exception(failure: Failure, node: int) -> Exception:
    """The remote exception with its type when it can be rebuilt, else a ``RemoteError``;
    either way the remote traceback is attached (as a note and ``remote_traceback``).

    Always an ``Exception``: a task's ``SystemExit``, ``KeyboardInterrupt`` or
    ``GeneratorExit`` comes back as a ``RemoteError`` naming it, never as an exit or an
    interrupt of the client."""
    exc: object = None
    if failure.exception is not None:
        try:
            exc = protocol.loads(failure.exception)
        except Exception:
            exc = None
    if not isinstance(exc, Exception):
        exc = RemoteError(failure.type_name, failure.message, failure.traceback)
    exc.add_note(f"\nRemote traceback (node {node}):\n{failure.traceback.rstrip()}")
    try:
        exc.remote_traceback = failure.traceback  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return exc
