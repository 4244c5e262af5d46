"""The client's end of one node's agent connection: submit tasks, get futures back.

Sends are made in the caller's thread. Replies are read by the process's one wire loop
(remote/wire_loop.py), which serves every node connection and fires every task deadline (a
task past its timeout fails with ``TimeoutError`` naming the function and limit, and the agent
is told to drop it). ``submit_many`` sends several tasks in one frame (the pool batches what it
has queued).

On the wire loop runs only bookkeeping: taking a finished task from the pending ones, ``pace``,
``on_results`` (the dispatcher's wake-up), and resolving a small result's future when nothing
else of this connection is queued and no done-callback is attached. Everything that may wait
or run user code goes to the connection's ``callback_lanes.Lane``, in arrival order:
``on_output`` (the user's sink), ``on_metrics`` and ``on_started`` (event subscribers),
``on_preemption`` and ``on_lost`` (the pool takes the node out of service: fencing over SSH,
replacement, re-sending its tasks), futures with done-callbacks or large or failed results, and
timed-out tasks (their failure and the ``Cancel`` sent to the agent), except done-callbacks
that are bookkeeping only (``callback_lanes.done_on_loop``: a pool's task events counting).

A task sent and not finished is *pending* here and belongs to this client. When the connection
breaks (the reader sees it end, or a send fails), every pending task is taken exactly once and
handed to ``on_lost``; the client never retries anything itself: the pool decides.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from skyward_iac.api.errors import NodeConnectionError
from skyward_iac.node import protocol
from skyward_iac.node.frame_decoder import Frame
from skyward_iac.node.messages import (
    Cancel,
    Configure,
    MetricSamples,
    Output,
    PreemptionNotice,
    Result,
    Started,
    Task,
    Welcome,
)
from skyward_iac.node.protocol import ByteStream
from skyward_iac.remote import fd_channel, memfd_arena, shared_buffers
from skyward_iac.remote.callback_lanes import Lane, call_back, done_on_loop, quiet_on_loop
from skyward_iac.remote.deadlines import Deadlines
from skyward_iac.remote.outcomes import fail, outcome_of, settle
from skyward_iac.remote.pacing import Pace
from skyward_iac.remote.wire_loop import Reading, wire_loop
from skyward_iac.remote.wire_streams import wire_stream

#: Called with the node index, the tasks that were pending when its connection broke, and why.
OnLost = Callable[[int, list["Submission"], str], Any]
#: A result's pickle at most this large is unpickled on the wire loop (when nothing waits).
INLINE_MAX = 65536


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
        #: Called after each frame of results is taken (the pool's dispatcher waits on it); it
        #: runs on the wire loop, so it must only wake someone up.
        self.on_results: Callable[[], Any] | None = None
        #: Called with the node index and a submission when a worker starts it; on the wire
        #: loop when the task's future has no done-callbacks (a pool's emits an event only
        #: when someone listens, and then its futures have done-callbacks), else on the lane.
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
        self._loop = wire_loop()
        self._deadlines = Deadlines(self._loop, lambda: self._pending, self._take, self._timed_out)
        self._closed = False
        self._lane = Lane()
        #: The memfds lent to the tasks sent (remote/memfd_arena.py; None: none are).
        self._loans: memfd_arena.Loans | None = None
        self.welcome = self._handshake(token)
        self._wire = wire_stream(stream)
        reading = Reading(self._wire, self._frames, self._ended) if self._wire else None
        if reading is None:
            # No file descriptor to watch (a test double): a thread of its own reads it.
            threading.Thread(target=self._read_blocking, name=f"agent-{node}-reader",
                             daemon=True).start()
        else:
            # The channel only writes to it (``sendall``): the loop does the reading.
            self._channel = fd_channel.channel(stream, self.welcome, reading.stream)
            self._loans = fd_channel.loans_of(self._channel)
            self._loop.register(reading)

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
        tasks, timed = [], []
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
                if submission.timeout is not None:
                    timed.append((submission.task_id, submission.timeout))
        if not tasks:
            return
        if timed:
            self._deadlines.add(timed)
        try:
            shared_buffers.send(self._channel, tasks, self.welcome)  # large arguments once
        except OSError as exc:
            names = ", ".join(sorted({s.name for s in submissions}))
            self._broken(f"sending {names} failed: {exc}")

    def _timed_out(self, due: list[tuple[Submission, float]]) -> None:
        """On the loop: tasks past their deadline (taken already); the lane fails them."""
        if self._loans:
            for entry, _ in due:
                self._loans.ended(entry.task_id, let_go=False)  # it may still be reading
        self._lane.run(self._fail_timed_out, due)

    def _fail_timed_out(self, due: list[tuple[Submission, float]]) -> None:
        for entry, limit in due:
            fail([entry], TimeoutError(
                f"{entry.name} did not finish within its timeout of {limit:g}s on node "
                f"{self.node} (task {entry.task_id})"))
            try:
                self._channel.send(Cancel(entry.task_id))
            except OSError:
                pass

    def close(self) -> list[Submission]:
        """Close the connection; returns the tasks still pending (unresolved: the caller
        decides what becomes of them). ``on_lost`` is not called for a close."""
        taken = self._shut()
        self._close_stream()
        return taken or []

    def _close_stream(self) -> None:
        if self._wire is not None:
            self._loop.detach(self._wire)  # the loop lets go of it, then closes it
        else:
            self._channel.close()

    def _shut(self) -> list[Submission] | None:
        """Mark the connection closed and take every pending task; None when it was closed
        already (the first closer takes them all)."""
        with self._pending_lock:
            if self._closed:
                return None
            self._closed = True
            taken, self._pending = list(self._pending.values()), {}
            self.pace.holding.clear()
        self._deadlines.close()
        if self._loans is not None:
            self._loans.close()
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
            self._close_stream()
        except OSError:
            pass
        if self.on_lost is not None:
            self.on_lost(self.node, lost, reason)
        else:
            fail(lost, NodeConnectionError(f"node {self.node}: {reason}"))

    def _read_blocking(self) -> None:
        """The reader of a stream the loop cannot watch; tells what it reads as the loop would."""
        while True:
            try:
                frame = protocol.read_frame_with_buffers(self._channel.stream)
                self._frames([frame])
            except Exception as exc:  # noqa: BLE001 - the connection is over, whatever it was
                self._ended(exc)
                return

    def _ended(self, exc: BaseException) -> None:
        """On the loop: the connection ended; the lane hands its pending tasks to ``on_lost``
        (after whatever it read before)."""
        if isinstance(exc, protocol.ProtocolError):
            reason = f"the agent broke the protocol: {exc}"
        elif isinstance(exc, OSError | EOFError):
            reason = f"agent connection lost: {exc}"
        else:
            reason = f"the agent sent what cannot be read: {exc!r}"
        self._lane.run(self._broken, reason)

    def _frames(self, frames: list[Frame]) -> None:
        """On the loop: what the agent sent (see the module doc for what runs where)."""
        taken = False
        for frame in frames:
            for message in protocol.unbatch(protocol.message_of(*frame)):
                if isinstance(message, Result):
                    taken = self._result(message) or taken
                    continue
                entry = self._pending.get(getattr(message, "task_id", -1))
                if isinstance(message, Started):
                    if entry is not None:
                        self._started(entry)
                elif isinstance(message, Output) and self._on_output is not None:
                    self._lane.run(self._output, message, entry and entry.context)
                elif isinstance(message, MetricSamples) and self.on_metrics is not None:
                    self._lane.run(self.on_metrics, self.node, message.samples)
                elif isinstance(message, PreemptionNotice) and self.on_preemption is not None:
                    self._lane.run(self.on_preemption, self.node, message)
        if taken and self.on_results is not None:
            self.on_results()

    def _result(self, result: Result) -> bool:
        """Take ``result``'s task and resolve its future here or on the lane; False when it
        was not pending (timed out already)."""
        entry = self._take(result.task_id)
        if self._loans:
            self._loans.ended(result.task_id, result.let_go)
        if entry is None:
            return False
        self.pace.record(entry.name, elapsed=time.monotonic() - entry.sent_at,
                         duration=result.duration, sent_idle=entry.sent_idle)
        entry.duration = result.duration
        # A short task's Started travels as its Result: tell ``on_started`` first, as it came.
        announce = None if entry.started else self.on_started
        entry.started = True
        future = entry.future
        condition = getattr(future, "_condition", None)
        if (self._lane.idle and result.failure is None and condition is not None
                and (result.value is None or len(result.value) <= INLINE_MAX)):
            # The round trip's fast path: nothing of this connection is queued before it, so
            # the waiter is woken from here; the future's done-callbacks (``_done_callbacks``,
            # CPython's, taken under its ``_condition`` so none is added meanwhile) run on the
            # lane. ``on_started`` runs here when there are none (see its attribute): a
            # hand-off per task cost 10-20% of a round trip. The value is rebuilt before the
            # condition is taken (the caller may be adding a callback meanwhile).
            value, error = outcome_of(result, entry.name, self.node)
            condition.acquire()  # (a Condition's own acquire: its ``with`` is two more calls)
            try:
                if future.done():
                    return True  # cancelled by its caller: its callbacks ran already
                callbacks = future._done_callbacks  # type: ignore[attr-defined]
                future._done_callbacks = []  # type: ignore[attr-defined]
                if announce is not None and not all(map(quiet_on_loop, callbacks)):
                    self._lane.run(announce, self.node, entry)
                elif announce is not None:
                    announce(self.node, entry)
                succeeded = settle(future, value, error)
            finally:
                condition.release()
            if callbacks:
                rest = done_on_loop(future, callbacks) if succeeded else callbacks
                if rest:
                    self._lane.run(call_back, future, rest)
            return True
        if announce is not None:
            self._lane.run(announce, self.node, entry)
        self._lane.run(self._resolve, entry, result)
        return True

    def _output(self, message: Output, context: contextvars.Context | None) -> None:
        assert self._on_output is not None
        if context is not None:
            # Under the cell that submitted the task, in a notebook.
            context.run(self._on_output, self.node, message.stream, message.text)
        else:
            self._on_output(self.node, message.stream, message.text)

    def _resolve(self, entry: Submission, result: Result) -> None:
        """Resolve ``entry``'s future with ``result`` (unless its caller cancelled it)."""
        if not entry.future.done():
            settle(entry.future, *outcome_of(result, entry.name, self.node))

    def _started(self, submission: Submission) -> None:
        """On the loop: mark ``submission`` started; ``on_started`` is told on the lane."""
        if not submission.started:
            submission.started = True
            if self.on_started is not None:
                self._lane.run(self.on_started, self.node, submission)

