"""``Pool``: the ready nodes of one stack and every way to run work on them.

Calls wait in one queue; a dispatcher thread hands each to a node with a free slot (a node
takes ``concurrency + buffer`` tasks at a time), round-robin among nodes with room, or to the
node a call targets. Results come back as futures resolved by each node's reader thread.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from typing import Any, TypeVar

from skyward_iac.api.errors import CollectionsDisabledError, ConfigError, NodeConnectionError
from skyward_iac.api.function import Function, PendingFunction, PendingFunctionGroup, function
from skyward_iac.api.spec import Options
from skyward_iac.orchestration.calls import pack_call
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
from skyward_iac.observability.events import Event
from skyward_iac.orchestration.collections import ClientCollections
from skyward_iac.orchestration.node import Node

T = TypeVar("T")
R = TypeVar("R")


def print_output(node: int, stream: str, text: str) -> None:
    """Default sink of remote output: each line prefixed by its node, on the same stream."""
    target = sys.stderr if stream == "stderr" else sys.stdout
    lines = text.splitlines(keepends=True)
    target.write("".join(f"[node {node}] {line}" for line in lines))
    target.flush()


@dataclass
class _Call:
    pending: PendingFunction[Any]
    payload: bytes
    future: Future[Any]
    node: int | None
    attempts: int = 0


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
        #: Called with a node's index when its connection is lost (set by ``Compute``).
        self.on_node_lost: Callable[[int], None] | None = None
        #: Where the pool's events go; ``Compute`` passes its own bus.
        self.events = events or EventBus()
        self.slots_per_node = options.worker.concurrency + options.worker.buffer
        self._calls: deque[_Call] = deque()
        self._wakeup = threading.Condition()
        self._next_node = 0
        self._closed = False
        threading.Thread(target=self._dispatch, name=f"{stack_name}-dispatch", daemon=True).start()

    # ---- placement -----------------------------------------------------------------------

    def on(self, event_type: type[Event], callback: Callable[[Any], Any]) -> Subscription:
        """Call ``callback(event)`` for every event of ``event_type`` (and its subclasses)."""
        return self.events.subscribe(callback, event_type)

    def current_nodes(self) -> int:
        """How many nodes are ready right now."""
        return len(self.nodes)

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

    def _has_room(self, index: int) -> bool:
        return index not in self.lost and self.nodes[index].agent.in_flight < self.slots_per_node

    def _next_call(self) -> tuple[int, _Call] | None:
        """The first queued call that a node with a free slot can take, and that node."""
        count = len(self.nodes)
        with_room = [
            index for step in range(count)
            if self._has_room(index := (self._next_node + step) % count)
        ]
        if not with_room:
            return None  # nothing can move: no need to scan the queue
        for position, call in enumerate(self._calls):
            if call.node is None:
                index = with_room[0]
                self._next_node = (index + 1) % count
            elif call.node in with_room:
                index = call.node
            else:
                continue
            del self._calls[position]
            return index, call
        return None

    def _dispatch(self) -> None:
        with self._wakeup:
            while not self._closed:
                chosen = self._next_call()
                if chosen is None:
                    self._wakeup.wait()
                    continue
                index, call = chosen
                self._send(call, self.nodes[index])

    def _send(self, call: _Call, node: Node) -> None:
        if call.future.cancelled():
            return
        timeout = call.pending.timeout or self.options.default_compute_timeout
        try:
            remote = node.agent.submit(call.pending.name, call.payload, timeout)
        except NodeConnectionError as exc:
            if not self._retry(call):
                call.future.set_exception(exc)
            return
        remote.add_done_callback(lambda done: self._finished(done, call))

    def _finished(self, remote: Future[Any], call: _Call) -> None:
        error = remote.exception()
        if isinstance(error, NodeConnectionError) and self._retry(call):
            return
        if not call.future.cancelled():
            if error is not None:
                call.future.set_exception(error)
            else:
                call.future.set_result(remote.result())
        with self._wakeup:
            self._wakeup.notify()

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

    def node_lost(self, index: int) -> None:
        """A node's connection broke: send it nothing more until it is replaced."""
        with self._wakeup:
            if self._closed or index in self.lost:
                return
            self.lost.add(index)
        if self.on_node_lost is not None:
            self.on_node_lost(index)

    def replace(self, index: int, node: Node) -> None:
        """Put a replacement node in service at ``index``."""
        old = self.nodes[index]
        with self._wakeup:
            self.nodes[index] = node
            self.lost.discard(index)
            self._wakeup.notify_all()
        old.close()

    def _enqueue(self, pending: PendingFunction[T], payload: bytes, node: int | None) -> Future[T]:
        if self._closed:
            raise NodeConnectionError(f"pool {self.stack_name} is closed")
        future: Future[T] = Future()
        with self._wakeup:
            self._calls.append(_Call(pending, payload, future, node))
            self._wakeup.notify()
        return future

    # ---- the public operations -----------------------------------------------------------

    def run_async(self, pending: PendingFunction[T], *, target: None | str | int = None) -> Future[T]:
        """Start ``pending`` on one node (round-robin unless ``target``); ``pending > pool``."""
        return self._enqueue(pending, pack_call(pending), self._node_index(target))

    def run(self, pending: PendingFunction[T], *, target: None | str | int = None) -> T:
        """Run ``pending`` on one node and return its result; ``pending >> pool``."""
        return self.run_async(pending, target=target).result()

    def broadcast(self, pending: PendingFunction[T]) -> list[T]:
        """Run ``pending`` on every node; one result per node, in node order; ``pending @ pool``."""
        payload = pack_call(pending)
        futures = [self._enqueue(pending, payload, index) for index in range(len(self.nodes))]
        return [future.result() for future in futures]

    def run_parallel(self, group: PendingFunctionGroup[Any]) -> Any:
        """Run a group's calls concurrently: a tuple, or a generator when it streams."""
        futures = [self.run_async(pending) for pending in group.items]
        if not group.stream:
            return tuple(future.result() for future in futures)
        return _stream(futures, group.ordered)

    def map(self, fn: Callable[[Any], R] | Function[Any, R], items: Iterable[Any]) -> list[R]:
        """``fn(item)`` for every item, spread over the nodes; results in input order."""
        remote = fn if isinstance(fn, Function) else function(fn)
        futures = [self.run_async(remote(item)) for item in items]
        return [future.result() for future in futures]

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

    def __repr__(self) -> str:
        return f"<Pool {self.stack_name} nodes={len(self.nodes)}>"


def _stream(futures: list[Future[Any]], ordered: bool) -> Iterator[Any]:
    if ordered:
        for future in futures:
            yield future.result()
    else:
        for future in as_completed(futures):
            yield future.result()
