"""``Pool``: the ready nodes of one stack and every way to run work on them.

The user's handle on a running pool. Calls go through the pool's ``Dispatcher`` (the queue,
placement and retries, see ``dispatch.py``); which nodes exist is the pool's ``Membership``'s
business (``membership.py``), changed through ``resize``; collections are reached through the
head node.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, as_completed
from typing import Any, TypeVar

from skyward_iac.api.errors import CollectionsDisabledError, ConfigError
from skyward_iac.api.function import Function, PendingFunction, PendingFunctionGroup, function
from skyward_iac.api.spec import MAX_NODES, Nodes
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
from skyward_iac.infra.stacks import access
from skyward_iac.node.messages import PickledFunction
from skyward_iac.observability.bus import EventBus, Subscription
from skyward_iac.observability.events import Event
from skyward_iac.observability.streams import write_lines
from skyward_iac.orchestration.collections import ClientCollections
from skyward_iac.orchestration.dispatch import Call, Dispatcher, call_for
from skyward_iac.orchestration.membership import Membership
from skyward_iac.orchestration.node import Node
from skyward_iac.orchestration.notebook import cell_context
from skyward_iac.orchestration.plan import PoolPlan
from skyward_iac.remote.calls import pack_call, pack_function
from skyward_iac.remote.forward import LocalForward, Trouble
from skyward_iac.remote.shared_buffers import BatchDigests

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("skyward")


def print_output(node: int, stream: str, text: str) -> None:
    """Default sink of remote output: each line prefixed by its node, on the same stream.

    Whole lines only, never inside one the client is printing (``streams.write_lines``); what
    a task left without a newline at its end is ended here, so the next line, the client's or
    another node's, starts on a line of its own."""
    if not text:
        return
    target = sys.stderr if stream == "stderr" else sys.stdout
    lines = text.splitlines(keepends=True)
    write_lines(target, "".join(f"[node {node}] {line}" for line in lines))


#: ``map`` packs and places its calls in chunks of this many, so the first tasks are running
#: while the rest are still being pickled.
MAP_CHUNK = 64

#: Changes the pool's target: (desired, floor, ceiling); blocks until it is reached.
Resizer = Callable[[int, int, int], None]


class Pool:
    """Ready nodes of one stack and the operations that run work on them."""

    def __init__(self, plan: PoolPlan, dispatcher: Dispatcher, membership: Membership,
                 collections: ClientCollections | None, events: EventBus,
                 resizer: Resizer) -> None:
        self.options = plan.options
        self.events = events
        self._dispatcher = dispatcher
        self._membership = membership
        self._collections = collections
        self._resizer = resizer
        self._default_timeout = plan.options.default_compute_timeout

    @property
    def stack_name(self) -> str:
        """The pool's stack, as its identity names it (shared by every part of the pool)."""
        return self._dispatcher.identity.stack

    # ---- the nodes ---------------------------------------------------------------------------

    @property
    def nodes(self) -> list[Node]:
        """The nodes in service now, by index."""
        return list(self._membership.in_service())

    @property
    def slots_per_node(self) -> int:
        return self._dispatcher.slots_per_node

    def current_nodes(self) -> int:
        """How many nodes are ready right now."""
        return self._membership.ready_count()

    def load(self) -> tuple[int, int]:
        """Calls waiting for a slot, and calls running on nodes."""
        return self._dispatcher.load()

    def on(self, event_type: type[Event], callback: Callable[[Any], Any]) -> Subscription:
        """Call ``callback(event)`` for every event of ``event_type`` (and its subclasses)."""
        return self.events.subscribe(callback, event_type)

    def resize(self, nodes: int | Nodes) -> None:
        """Change the pool's target now, for a fixed or an elastic pool, and wait until it is
        reached: a stack update adds or removes nodes (removed ones finish their calls first).

        ``int``: the new node count (on an elastic pool it must lie within its bounds);
        ``sky.Nodes(desired, min, max)``: the count and new bounds. A request the pool cannot
        take raises ``ConfigError``.
        """
        membership = self._membership
        if isinstance(nodes, Nodes):
            desired = nodes.desired
            floor, ceiling = nodes.min or desired, max(nodes.max or desired, desired)
        elif isinstance(nodes, int) and not isinstance(nodes, bool):
            desired = nodes
            if membership.floor == membership.ceiling:  # a fixed pool stays fixed, at the new size
                floor = ceiling = desired
            else:
                floor, ceiling = membership.floor, membership.ceiling
                if not floor <= desired <= ceiling:
                    raise ConfigError(
                        f"resize({desired}) is outside this elastic pool's bounds "
                        f"{floor}..{ceiling}; pass sky.Nodes(desired={desired}, min=..., "
                        "max=...) to change the bounds too")
        else:
            raise ConfigError(f"resize needs a node count or sky.Nodes(...), got {nodes!r}")
        if not 1 <= desired <= MAX_NODES:
            raise ConfigError(f"resize needs 1 <= nodes <= {MAX_NODES}, got {desired}")
        self._resizer(desired, floor, ceiling)

    def _node_index(self, target: None | str | int) -> int | None:
        if target is None:
            return None
        if target == "head":
            return 0
        count = self._membership.desired
        if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < count:
            return target
        raise ConfigError(
            f"target must be None, 'head' or a node rank in 0..{count - 1}, got {target!r}"
        )

    # ---- queueing ----------------------------------------------------------------------------

    def _call(self, pending: PendingFunction[T], node: int | None,
              packed: Any = None, copy: bool = True,
              function: PickledFunction | None = None,
              digests: BatchDigests | None = None) -> tuple[Call, Future[T]]:
        """A call ready to queue; ``copy=False`` when the caller blocks until the result, so
        its arrays cannot change while they are being sent (no snapshot needed)."""
        packed = packed or pack_call(pending, copy, function, digests)
        call, future = call_for(pending, packed, next(self._dispatcher.task_ids), node,
                                self._default_timeout)
        call.context = cell_context()  # None outside a Jupyter kernel
        return call, future

    def _enqueue(self, calls: list[Call]) -> None:
        self._dispatcher.enqueue(calls)

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
        calls = [self._call(pending, node.index, packed) for node in self.nodes]
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
        pickled once for the whole batch; without ``copy`` (the caller waits for them all, so
        its arrays cannot change meanwhile), each large argument is digested once too."""
        futures: list[Future[Any]] = []
        chunk: list[Call] = []
        functions: dict[int, tuple[Any, PickledFunction | None]] = {}
        digests = None if copy else BatchDigests()
        for pending in pendings:
            known = functions.get(id(pending.fn))
            if known is None:
                try:
                    known = functions[id(pending.fn)] = (pending.fn, pack_function(pending.fn))
                except Exception:
                    known = (pending.fn, None)  # pack_call names the culprit
            call, future = self._call(pending, None, copy=copy, function=known[1],
                                      digests=digests)
            chunk.append(call)
            futures.append(future)
            if len(chunk) == MAP_CHUNK:
                self._enqueue(chunk)
                chunk = []
        if chunk:
            self._enqueue(chunk)
        return futures

    # ---- ports -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def forward(self, remote_port: int, node: int | str = 0, *,
                local_port: int = 0) -> Iterator[int]:
        """Forward a port of this machine to ``remote_port`` on ``node``'s loopback (a
        TensorBoard, a Jupyter server, a dashboard a task started) for the ``with`` block, which
        gets the local port: ``local_port``, or a free one when 0.

        It listens on 127.0.0.1 only and serves this user only: another local user's
        connections are closed (``same_user.py``). Each connection goes through the
        node's SSH connection (a replacement node's, after a replacement); one the node cannot
        open (nothing listens there yet) is closed at once, and logged.
        """
        index = self._node_index(node) if node is not None else None
        if index is None:
            raise ConfigError("forward needs a node: 'head' or a node rank, not None")
        for name, port, low in (("remote_port", remote_port, 1), ("local_port", local_port, 0)):
            if not isinstance(port, int) or isinstance(port, bool) or not low <= port <= 65535:
                raise ConfigError(f"forward needs {low} <= {name} <= 65535, got {port!r}")

        def transport() -> Any:
            serving = next((n for n in self.nodes if n.address.index == index), None)
            return serving.connection.transport if serving is not None else None

        told: set[Trouble] = set()

        def on_trouble(trouble: Trouble, detail: str) -> None:
            if trouble is not Trouble.CLOSED_BY_TARGET:  # how HTTP servers end connections
                (log.debug if trouble in told else log.warning)(
                    "pool %s: a connection forwarded to port %d on node %s was closed: %s",
                    self.stack_name, remote_port, index, detail)
                told.add(trouble)

        forward = LocalForward(transport, ("127.0.0.1", remote_port), on_trouble,
                               local_port=local_port)
        # Recorded as ``skyward-iac forward`` is: who, when, which node and port.
        access.record_later(self.stack_name, f"forward node {index} port {remote_port} to "
                                             f"127.0.0.1:{forward.port} (pool.forward)")
        try:
            yield forward.port
        finally:
            forward.close()

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

    def __repr__(self) -> str:
        return f"<Pool {self.stack_name} nodes={self.current_nodes()}>"


def _stream(futures: list[Future[Any]], ordered: bool) -> Iterator[Any]:
    if ordered:
        for future in futures:
            yield future.result()
    else:
        for future in as_completed(futures):
            yield future.result()
