"""``Pool``: the ready nodes of one stack and every way to run work on them.

Calls wait in one queue and are handed to nodes with a free slot (a node takes
``concurrency + buffer`` tasks at a time), round-robin among nodes with room, or to the node a
call targets. The caller's thread places what fits at once (no thread hop on the way out); a
dispatcher thread places the rest as results free slots. All calls placed on one node in one
go travel in one frame. Results come back as futures resolved by each node's reader thread.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import CancelledError, Future, as_completed
from dataclasses import dataclass
from typing import Any, TypeVar

from skyward_iac.api.errors import CollectionsDisabledError, ConfigError, NodeConnectionError
from skyward_iac.api.function import Function, PendingFunction, PendingFunctionGroup, function
from skyward_iac.api.spec import Nodes, Options
from skyward_iac.collections import (
    Backend,
    Barrier,
    Consistency,
    Counter,
    Dict,
    Lock,
    Queue,
    Set,
)
from skyward_iac.observability.bus import EventBus, Subscription
from skyward_iac.observability.events import Event, Metric, TaskCompleted, TaskQueued, TaskStarted
from skyward_iac.observability.task_progress import TaskTally
from skyward_iac.orchestration.calls import PackedCall, pack_call, pack_function
from skyward_iac.orchestration.collections import ClientCollections
from skyward_iac.orchestration.node import Node
from skyward_iac.remote.agent_client import Submission
from skyward_iac.remote.protocol import PickledFunction, PreemptionNotice

T = TypeVar("T")
R = TypeVar("R")


def print_output(node: int, stream: str, text: str) -> None:
    """Default sink of remote output: each line prefixed by its node, on the same stream."""
    target = sys.stderr if stream == "stderr" else sys.stdout
    lines = text.splitlines(keepends=True)
    target.write("".join(f"[node {node}] {line}" for line in lines))
    target.flush()


#: ``map`` packs and places its calls in chunks of this many, so the first tasks are running
#: while the rest are still being pickled.
MAP_CHUNK = 64


@dataclass
class _Call:
    pending: PendingFunction[Any]
    packed: PackedCall
    future: Future[Any]
    node: int | None
    attempts: int = 0
    task_id: int = 0
    #: The node it was last handed to, and what was sent there.
    sent_to: int | None = None
    submission: Submission | None = None


class Pool:
    """Ready nodes of one stack and the operations that run work on them."""

    def __init__(self, stack_name: str, nodes: list[Node], options: Options,
                 collections: ClientCollections | None = None,
                 events: EventBus | None = None) -> None:
        self.stack_name = stack_name
        self.nodes = nodes
        self.options = options
        self._collections = collections
        #: Nodes whose connection was lost, waiting for their replacement.
        self.lost: set[int] = set()
        #: Called with a node's index, why it is out of service, and whether it still runs (so
        #: its instance must be recreated, not just found missing) (set by ``Compute``).
        self.on_node_lost: Callable[[int, str, bool], None] | None = None
        #: Resizes the pool to a node count (set by ``Compute``).
        self.resizer: Callable[[int], None] | None = None
        #: Where the pool's events go; ``Compute`` passes its own bus.
        self.events = events or EventBus()
        self.slots_per_node = options.worker.concurrency + options.worker.buffer
        self._calls: deque[_Call] = deque()
        self._wakeup = threading.Condition()
        self._next_node = 0
        #: Calls placed on each node and not yet handed to its agent client (sent outside the lock).
        self._placing = [0] * len(nodes)
        self._closed = False
        self._task_ids = itertools.count(1)
        #: Counts calls for ``TaskProgress`` while anyone listens.
        self._tally = TaskTally(stack_name, self.load, self.events.emit)
        #: Unfinished calls someone listens to, by their future (see ``_watch``).
        self._watched: dict[Future[Any], _Call] = {}
        for node in nodes:
            self._listen(node)
        threading.Thread(target=self._dispatch, name=f"{stack_name}-dispatch", daemon=True).start()

    def _listen(self, node: Node) -> None:
        """Receive ``node``'s freed slots (to place more calls), its metric samples and its
        cloud's preemption notice."""
        node.agent.on_results = self._slots_freed
        node.agent.on_metrics = self._metrics
        node.agent.on_preemption = self._preempted

    def _preempted(self, node: int, notice: PreemptionNotice) -> None:
        # Called by the node's reader thread: no new work there; replace it before it dies.
        left = max(0.0, notice.deadline - time.time())
        self.node_lost(node, f"{notice.reason}; it stops in {left:.0f}s", alive=True)

    def _metrics(self, node: int, samples: tuple[Any, ...]) -> None:
        # Called by a node's reader thread with ``observability.sampler.MetricSample``s.
        for sample in samples:
            self.events.emit(Metric(stack=self.stack_name, node=node, name=sample.name,
                                    value=sample.value, unit=sample.unit, device=sample.device,
                                    timestamp=sample.timestamp))

    # ---- task events (only built when someone listens) -------------------------------------

    # Anyone listening gets TaskProgress and failures; TaskQueued/TaskStarted and successful
    # TaskCompleted only when a subscriber asked for them (``task_detail``), since a
    # 10,000-task map would build 30,000 (positional arguments: the cheapest way to build).
    # Watching allocates nothing per call (one shared callback, calls found by their future):
    # every object more per call makes the garbage collector run more often, and it costs
    # the client several times what the object does.

    def _watch(self, calls: list[_Call]) -> None:
        detail = self.events.task_detail
        emit, stack, watched, completed = (self.events.emit, self.stack_name, self._watched,
                                           self._completed)
        for call in calls:
            if detail:
                emit(TaskQueued(stack, call.task_id, call.pending.name, call.node))
            watched[call.future] = call
            call.future.add_done_callback(completed)

    def _started(self, call: _Call, node: int) -> None:
        self.events.emit(TaskStarted(self.stack_name, call.task_id, call.pending.name, node))

    def _completed(self, future: Future[Any]) -> None:
        call = self._watched.pop(future)
        try:
            exc = future.exception()
        except CancelledError:
            error: str | None = "cancelled"
        else:
            error = None if exc is None else f"{type(exc).__name__}: {exc}"
        if error is not None or self.events.task_detail:
            ran = call.submission.duration if call.submission is not None else None
            self.events.emit(TaskCompleted(
                self.stack_name, call.task_id, call.pending.name,
                call.sent_to if call.sent_to is not None else -1, error is None, ran or 0.0,
                error))
        self._tally.completed(error is None)

    # ---- placement -----------------------------------------------------------------------

    def on(self, event_type: type[Event], callback: Callable[[Any], Any]) -> Subscription:
        """Call ``callback(event)`` for every event of ``event_type`` (and its subclasses)."""
        return self.events.subscribe(callback, event_type)

    def current_nodes(self) -> int:
        """How many nodes are ready right now."""
        with self._wakeup:
            return len(self.nodes) - len(self.lost)

    def _node_index(self, target: None | str | int) -> int | None:
        if target is None:
            return None
        if target == "head":
            return 0
        if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(self.nodes):
            return target
        raise ConfigError(
            f"target must be None, 'head' or a node rank in 0..{len(self.nodes) - 1}, got {target!r}"
        )

    def _place(self) -> dict[int, list[_Call]]:
        """Take the queued calls that nodes have room for (queue order; untargeted calls
        round-robin among nodes with room). Called with ``_wakeup`` held."""
        if not self._calls:
            return {}
        count = len(self.nodes)
        room = [0 if index in self.lost
                else self.slots_per_node - node.agent.in_flight - self._placing[index]
                for index, node in enumerate(self.nodes)]
        free = sum(r for r in room if r > 0)
        placed: dict[int, list[_Call]] = {}
        skipped: list[_Call] = []
        while free > 0 and self._calls:
            call = self._calls.popleft()
            index = call.node
            if index is None:
                index = next(i for step in range(count)
                             if room[i := (self._next_node + step) % count] > 0)
                self._next_node = (index + 1) % count
            elif room[index] <= 0:
                skipped.append(call)  # its node is full: later calls may still fit elsewhere
                continue
            room[index] -= 1
            free -= 1
            placed.setdefault(index, []).append(call)
        self._calls.extendleft(reversed(skipped))
        for index, calls in placed.items():
            self._placing[index] += len(calls)
        return placed

    def _send(self, placed: dict[int, list[_Call]]) -> None:
        """Hand each node its calls, in one frame per node (outside ``_wakeup``)."""
        tracing = self.events.task_detail
        for index, calls in placed.items():
            submissions = []
            for call in calls:
                call.sent_to = index
                call.submission = Submission(
                    call.pending.name, call.packed.payload,
                    call.pending.timeout or self.options.default_compute_timeout,
                    call.packed.buffers, call.future, functools.partial(self._retry, call),
                    functools.partial(self._started, call, index) if tracing else None)
                submissions.append(call.submission)
            try:
                self.nodes[index].agent.submit_many(submissions)
            except NodeConnectionError as exc:
                for call in calls:
                    if not call.future.done() and not self._retry(call):
                        call.future.set_exception(exc)
            finally:
                with self._wakeup:
                    self._placing[index] -= len(calls)

    def _dispatch(self) -> None:
        while True:
            with self._wakeup:
                while not self._closed and not (placed := self._place()):
                    self._wakeup.wait()
                if self._closed:
                    return
            self._send(placed)

    def _retry(self, call: _Call) -> bool:
        """Queue a call again after its node was lost, if it has retries left. A call pinned
        to a node (a broadcast) waits for that node's replacement."""
        if self._closed or call.attempts >= self.options.retry_on_interruption:
            return False
        call.attempts += 1
        with self._wakeup:
            self._calls.appendleft(call)
            self._wakeup.notify()
        return True

    def node_lost(self, index: int, reason: str = "connection to the node was lost",
                  alive: bool = False) -> None:
        """A node's connection broke (or it failed its health check, or its cloud announced
        its preemption: ``alive``): send it nothing more until it is replaced."""
        with self._wakeup:
            if self._closed or index in self.lost:
                return
            self.lost.add(index)
        if self.on_node_lost is not None:
            self.on_node_lost(index, reason, alive)

    def load(self) -> tuple[int, int]:
        """Calls waiting for a slot, and calls running on nodes."""
        with self._wakeup:
            return len(self._calls), sum(node.agent.in_flight for node in self.nodes)

    def add(self, node: Node) -> None:
        """Put a new node in service (an elastic pool growing); it must be the next index."""
        with self._wakeup:
            if node.address.index != len(self.nodes):
                raise ValueError(f"node {node.address.index} is not the next index")
            self._listen(node)  # its results wake the dispatcher too
            self.nodes.append(node)
            self._placing.append(0)
            self._wakeup.notify_all()

    def retire(self, index: int, timeout: float = 300.0) -> None:
        """Take the last node out of service: no new calls, wait for its running ones, close."""
        if index != len(self.nodes) - 1:
            raise ValueError("only the last node can be retired")
        with self._wakeup:
            self.lost.add(index)  # no new calls for it
        deadline = time.monotonic() + timeout
        while self.nodes[index].agent.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._wakeup:
            node = self.nodes.pop(index)
            self._placing.pop(index)
            self.lost.discard(index)
            self._next_node = 0
        node.close()

    def resize(self, nodes: int | Nodes) -> None:
        """Change the number of nodes now (a stack update adds or removes them)."""
        target = nodes.desired if isinstance(nodes, Nodes) else nodes
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ConfigError(f"resize needs a node count >= 1 or sky.Nodes(...), got {nodes!r}")
        if self.resizer is None:
            raise ConfigError("this pool cannot be resized")
        self.resizer(target)

    def replace(self, index: int, node: Node) -> None:
        """Put a replacement node in service at ``index``."""
        old = self.nodes[index]
        self._listen(node)
        with self._wakeup:
            self.nodes[index] = node
            self.lost.discard(index)
            self._wakeup.notify_all()
        old.close()

    def _slots_freed(self) -> None:
        # Called by a node's reader thread after results: the dispatcher may place more.
        if self._calls:
            with self._wakeup:
                self._wakeup.notify()

    def _enqueue(self, calls: list[_Call]) -> None:
        """Queue ``calls``; what fits on the nodes now is sent from this thread."""
        if self._closed:
            raise NodeConnectionError(f"pool {self.stack_name} is closed")
        watched = len(self.events) > 0
        if watched:
            self._watch(calls)
        with self._wakeup:
            self._calls.extend(calls)
            placed = self._place()
            if self._calls:
                self._wakeup.notify()
        self._send(placed)
        if watched:
            self._tally.changed()

    def _call(self, pending: PendingFunction[T], node: int | None,
              packed: PackedCall | None = None, copy: bool = True,
              function: PickledFunction | None = None) -> tuple[_Call, Future[T]]:
        """A queued call; ``copy=False`` when the caller blocks until the result, so its
        arrays cannot change while they are being sent (no snapshot needed)."""
        future: Future[T] = Future()
        packed = packed or pack_call(pending, copy, function)
        return _Call(pending, packed, future, node, task_id=next(self._task_ids)), future

    # ---- the public operations -----------------------------------------------------------

    def run_async(self, pending: PendingFunction[T], *, target: None | str | int = None) -> Future[T]:
        """Start ``pending`` on one node (round-robin unless ``target``); ``pending > pool``."""
        call, future = self._call(pending, self._node_index(target))
        self._enqueue([call])
        return future

    def run(self, pending: PendingFunction[T], *, target: None | str | int = None) -> T:
        """Run ``pending`` on one node and return its result; ``pending >> pool``."""
        call, future = self._call(pending, self._node_index(target), copy=False)
        self._enqueue([call])
        return future.result()

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run ``pending`` on every node; one result per node, in node order; ``pending @ pool``."""
        packed = pack_call(pending, copy=False)
        calls = [self._call(pending, index, packed) for index in range(len(self.nodes))]
        self._enqueue([call for call, _ in calls])
        return [future.result() for _, future in calls]

    def run_parallel(self, group: PendingFunctionGroup[Any]) -> Any:
        """Run a group's calls concurrently: a tuple, or a generator when it streams."""
        futures = self._start_all(group.items, copy=group.stream)
        if not group.stream:
            return tuple(future.result() for future in futures)
        return _stream(futures, group.ordered)

    def map(self, fn: Callable[[Any], R] | Function[Any, R], items: Iterable[Any]) -> list[R]:
        """``fn(item)`` for every item, spread over the nodes; results in input order."""
        remote = fn if isinstance(fn, Function) else function(fn)
        # Copies kept: ``items`` may be a generator that refills one array for every item.
        return [future.result() for future in self._start_all(remote(item) for item in items)]

    def _start_all(self, pendings: Iterable[PendingFunction[Any]],
                   copy: bool = True) -> list[Future[Any]]:
        """Pack and queue calls in chunks; their futures in order. Each distinct function is
        pickled once for the whole batch."""
        futures: list[Future[Any]] = []
        chunk: list[_Call] = []
        functions: dict[int, tuple[Any, PickledFunction | None]] = {}
        for pending in pendings:
            known = functions.get(id(pending.fn))
            if known is None:
                try:
                    known = functions[id(pending.fn)] = (pending.fn, pack_function(pending.fn))
                except Exception:
                    known = (pending.fn, None)  # pack_call names the culprit
            call, future = self._call(pending, None, copy=copy, function=known[1])
            chunk.append(call)
            futures.append(future)
            if len(chunk) == MAP_CHUNK:
                self._enqueue(chunk)
                chunk = []
        if chunk:
            self._enqueue(chunk)
        return futures

    # ---- distributed collections (the same ones tasks see) ---------------------------------

    @property
    def collections(self) -> Backend:
        """The pool's collections backend, reached from the client through an SSH tunnel."""
        if self._collections is None:
            raise CollectionsDisabledError(f"pool {self.stack_name} has no collections")
        return self._collections.backend

    def dict(self, name: str, *, consistency: Consistency | None = None) -> Dict:
        """The pool's distributed dict ``name``."""
        return self.collections.dict(name, consistency=consistency)

    def set(self, name: str, *, consistency: Consistency | None = None) -> Set:
        """The pool's distributed set ``name``."""
        return self.collections.set(name, consistency=consistency)

    def counter(self, name: str, *, consistency: Consistency | None = None) -> Counter:
        """The pool's distributed counter ``name``."""
        return self.collections.counter(name, consistency=consistency)

    def queue(self, name: str) -> Queue:
        """The pool's distributed FIFO queue ``name``."""
        return self.collections.queue(name)

    def barrier(self, name: str, n: int) -> Barrier:
        """The pool's barrier ``name`` for ``n`` participants."""
        return self.collections.barrier(name, n)

    def lock(self, name: str, timeout: float = 30) -> Lock:
        """The pool's distributed lock ``name``."""
        return self.collections.lock(name, timeout)

    def close(self) -> None:
        """Disconnect from every node; calls still queued fail with ``NodeConnectionError``."""
        with self._wakeup:
            self._closed = True
            queued, self._calls = list(self._calls), deque()
            self._wakeup.notify_all()
        for call in queued:
            call.future.set_exception(NodeConnectionError(f"pool {self.stack_name} closed"))
        if self._collections is not None:
            self._collections.close()
        for node in self.nodes:
            node.close()
        self._tally.flush()  # the final counts, before the console stops

    def __repr__(self) -> str:
        return f"<Pool {self.stack_name} nodes={len(self.nodes)}>"


def _stream(futures: list[Future[Any]], ordered: bool) -> Iterator[Any]:
    if ordered:
        for future in futures:
            yield future.result()
    else:
        for future in as_completed(futures):
            yield future.result()
