"""``Dispatcher``: a pool's queue of calls and how they reach nodes.

Calls wait in one queue and are handed to nodes in service with a free slot (a node takes
``concurrency + buffer`` tasks at a time; with ``buffer="auto"`` the buffer is what the node's
measured pace asks for, see ``remote/pacing.py``), round-robin among nodes with room, or to
the node a call targets. The caller's thread places what fits at once (no thread hop on the
way out); a dispatcher thread places the rest as results free slots. All calls placed on one
node in one go travel in one frame.

The dispatcher alone decides what becomes of a call whose node was lost: the node leaves
service first, then each of its unfinished calls is retried (at most
``Options.retry_on_interruption`` times, counted once per loss) but held until the lost node
is *fenced* (its agent and workers killed, or its instance removed by the stack), so a retry
never runs beside its first attempt. A call no node can take (its node lost and not replaced,
or no node in service) fails after its timeout with an error saying why.
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from skyward_iac.api import retry
from skyward_iac.api.errors import NodeConnectionError, SkywardError
from skyward_iac.api.function import PendingFunction
from skyward_iac.api.options import Options
from skyward_iac.observability.bus import EventBus
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.node import Node
from skyward_iac.orchestration.task_events import TaskEvents
from skyward_iac.remote.agent_client import Submission, fail
from skyward_iac.remote.calls import PackedCall
from skyward_iac.remote.pacing import MAX_AHEAD, ahead

log = logging.getLogger("skyward")
#: How often queued calls are checked for having waited too long without any node to take them.
STARVATION_CHECK = 1.0


@dataclass(eq=False)
class Call(Submission):
    """A queued call: the submission the agent client sends, plus what the pool needs."""

    pending: PendingFunction[Any] | None = None
    #: The node index it must run on (a broadcast, ``target=``), or None for any node.
    node: int | None = None
    attempts: int = 0
    #: The node it was last handed to.
    sent_to: int | None = None
    #: A lost node that must be fenced before this call may run again.
    fence: int | None = None
    #: Since when no node in service could take it (monotonic), or None.
    unserved_since: float | None = None


def call_for(pending: PendingFunction[Any], packed: PackedCall, task_id: int, node: int | None,
             timeout: float) -> tuple[Call, Future[Any]]:
    """A new call for ``pending`` and its future."""
    call = Call(task_id, pending.name, packed.payload, pending.timeout or timeout,
                packed.buffers, pending=pending, node=node)
    return call, call.future


class Dispatcher:
    """Queue, placement, sending, and retries of lost calls (see the module doc)."""

    def __init__(self, identity: PoolIdentity, options: Options, events: EventBus,
                 task_ids: Iterable[int] | None = None) -> None:
        self.identity = identity
        self.options = options
        worker = options.worker
        #: The slots every node always has (``concurrency`` plus a fixed ``buffer``).
        self.slots_per_node = worker.concurrency + worker.fixed_buffer
        self._paced = worker.buffer == "auto"
        self.task_ids = iter(task_ids or itertools.count(1))
        self.events = TaskEvents(identity, events, self.load)
        self._calls: deque[Call] = deque()
        #: Guards the queue and the placement state; ``_wakeup``, on the same lock, wakes the
        #: dispatcher thread (taken as ``_lock``: a ``Condition``'s own enter and exit are
        #: Python calls, twice a round trip).
        self._lock = threading.RLock()
        self._wakeup = threading.Condition(self._lock)
        #: Nodes in service, by index order (published by the pool's membership).
        self._service: tuple[Node, ...] = ()
        self._next = 0
        #: Calls placed on each node and not yet handed to its agent client.
        self._placing: dict[int, int] = {}
        #: Lost nodes whose calls are held until they are fenced, and why they were lost.
        self._unfenced: dict[int, str] = {}
        #: Why each node index is out of service (for the errors of calls nobody can take).
        self._why_out: dict[int, str] = {}
        self._closed = False
        #: What closed the pool, when it was not a plain close (a spent budget).
        self._closed_by: SkywardError | None = None
        threading.Thread(target=self._dispatch, name=f"{identity.stack}-dispatch",
                         daemon=True).start()

    # ---- the nodes ------------------------------------------------------------------------

    def serve(self, nodes: tuple[Node, ...]) -> None:
        """Nodes in service from now on (by index order); new ones start taking calls."""
        with self._lock:
            self._service = nodes
            for node in nodes:
                self._why_out.pop(node.index, None)
            self._wakeup.notify_all()

    def out_of_service(self, index: int, reason: str) -> None:
        """Node ``index`` takes no more calls (lost, unhealthy, leaving): ``reason`` says why."""
        with self._lock:
            self._why_out[index] = reason
            self._service = tuple(n for n in self._service if n.index != index)

    def lost(self, index: int, submissions: list[Submission], reason: str) -> None:
        """Node ``index`` was lost with ``submissions`` unfinished: retry each (held until the
        node is fenced) or fail it when it has no retries left. Call after the node left
        service, so no retry lands on it. ``api/retry.for_task`` bounds the runs; no delay:
        the hold until the node is fenced is the wait."""
        policy = retry.for_task(self.options)
        retry_left = self.options.retry_on_interruption
        error = NodeConnectionError(f"node {index} was lost ({reason})")
        retried: list[Call] = []
        with self._lock:
            self._unfenced.setdefault(index, reason)
            for submission in submissions:
                if (not isinstance(submission, Call) or self._closed
                        or submission.future.done()
                        or not policy.allows(submission.attempts + 2)):  # runs made + 1
                    fail([submission], error if not isinstance(submission, Call) else
                         NodeConnectionError(f"{submission.name} (task {submission.task_id}): "
                                             f"{error}; no retries left "
                                             f"({submission.attempts} of {retry_left} used)"))
                    continue
                submission.attempts += 1
                submission.fence = index
                submission.started = False
                retried.append(submission)
            self._calls.extendleft(reversed(retried))
            self._wakeup.notify()
        if retried:
            log.info("stack %s: %d call(s) of node %d will be retried once it is fenced",
                     self.identity.stack, len(retried), index)

    def fenced(self, index: int) -> None:
        """Nothing of lost node ``index`` runs any more: its held calls may run again."""
        with self._lock:
            if self._unfenced.pop(index, None) is None:
                return
            for call in self._calls:
                if call.fence == index:
                    call.fence = None
            self._wakeup.notify_all()

    # ---- queueing and placement -----------------------------------------------------------

    def enqueue(self, calls: list[Call]) -> None:
        """Queue ``calls``; what fits on the nodes now is sent from this thread."""
        if self._closed:
            if self._closed_by is not None:  # a copy: each late call its own traceback
                raise copy.copy(self._closed_by)
            raise NodeConnectionError(f"pool {self.identity.stack} is closed")
        self.events.watch(calls)
        with self._lock:
            self._calls.extend(calls)
            placed = self._place()
            if self._calls:
                self._wakeup.notify()
        self._send(placed)
        self.events.changed()

    def _place(self) -> dict[Node, list[Call]]:
        """Take the queued calls that nodes have room for (queue order; untargeted calls
        round-robin among nodes with room, and when the first of them fits nowhere, the rest
        wait behind it). Called with ``_lock`` held. Paid once per round trip: what only
        some calls need (the index of nodes, the run times a node holds) is built on first
        use, and nothing is allocated per node but the load and room lists."""
        service, queue = self._service, self._calls
        if not queue or not service:
            return {}
        slots, paced, placing = self.slots_per_node, self._paced, self._placing
        full = slots + (MAX_AHEAD if paced else 0)
        load: list[int] = []
        cap: list[int] = []
        free = 0
        for node in service:
            agent = node.agent
            held = agent.in_flight + placing.get(node.index, 0)
            # A node whose connection just broke has no room: it leaves service in a moment.
            room = 0 if agent.closed else full
            load.append(held)
            cap.append(room)
            if room > held:
                free += room - held
        if free <= 0:
            return {}
        # Each node's longest expected run time among what it holds ("auto" only), read when
        # a node past its slots needs it.
        holding: dict[int, float] = {}
        by_index: dict[int, int] | None = None
        placed: dict[Node, list[Call]] = {}
        skipped: list[Call] = []
        count = len(service)

        def fits(position: int, call: Call) -> bool:
            if load[position] >= cap[position]:
                return False
            if load[position] < slots:
                return True  # a free slot takes anything
            node = service[position]
            pace = node.agent.pace
            known = holding.get(position)
            if known is None:
                known = holding[position] = pace.longest_held()
            # ... and among what this round placed on it.
            run_time = max(known, pace.run_time(call.name),
                           *(pace.run_time(c.name) for c in placed.get(node, ())))
            return load[position] < slots + ahead(
                self.options.worker.concurrency, pace.overhead, run_time)

        while free > 0 and queue:
            call = queue.popleft()
            if call.fence is not None:
                skipped.append(call)  # its first attempt may still run somewhere
                continue
            if call.node is None:
                for step in range(count):
                    position = (self._next + step) % count
                    if fits(position, call):
                        break
                else:
                    skipped.append(call)  # no node has room for it: later ones wait behind it
                    break
                self._next = (position + 1) % count
            else:
                if by_index is None:
                    by_index = {node.index: position for position, node in enumerate(service)}
                target = by_index.get(call.node)
                if target is None or not fits(target, call):
                    skipped.append(call)  # its node is full or away: later calls may fit
                    continue
                position = target
            load[position] += 1
            free -= 1
            placed.setdefault(service[position], []).append(call)
        if skipped:
            queue.extendleft(reversed(skipped))
        for node, calls in placed.items():
            placing[node.index] = placing.get(node.index, 0) + len(calls)
        return placed

    def _send(self, placed: dict[Node, list[Call]]) -> None:
        """Hand each node its calls, in one frame per node (outside ``_lock``)."""
        for node, calls in placed.items():
            for call in calls:
                call.sent_to = node.index
                call.unserved_since = None
            try:
                node.agent.submit_many(calls)  # type: ignore[arg-type]
            except NodeConnectionError:
                # Closed before anything was sent: these calls never left, so they go back
                # to the queue as they were (no attempt used); the node is out of service.
                with self._lock:
                    self._calls.extendleft(reversed([c for c in calls if not c.future.done()]))
            finally:
                with self._lock:
                    self._placing[node.index] -= len(calls)
                    if self._calls:  # room counted again: queued calls may fit now
                        self._wakeup.notify()

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not (placed := self._place()):
                    self._wakeup.wait(STARVATION_CHECK if self._calls else None)
                    if self._calls:
                        self._fail_unserved(time.monotonic())
                if self._closed:
                    return
            self._send(placed)

    def _fail_unserved(self, now: float) -> None:
        """Fail queued calls that no node could take for longer than their timeout (with
        ``_lock`` held)."""
        in_service = {node.index for node in self._service}
        expired: list[tuple[Call, str]] = []
        for call in self._calls:
            why = self._unserved_reason(call, in_service)
            if why is None:
                call.unserved_since = None
                continue
            if call.unserved_since is None:
                call.unserved_since = now
            elif call.timeout is not None and now - call.unserved_since > call.timeout:
                expired.append((call, why))
        if not expired:
            return
        gone = {id(call) for call, _ in expired}
        self._calls = deque(c for c in self._calls if id(c) not in gone)
        for call, why in expired:
            fail([call], NodeConnectionError(
                f"{call.name} (task {call.task_id}) waited {call.timeout:g}s with no node able "
                f"to take it: {why}"))

    def _unserved_reason(self, call: Call, in_service: set[int]) -> str | None:
        """Why no node can take ``call`` now, or None when one can (or will when a slot frees)."""
        if call.fence is not None:
            reason = self._unfenced.get(call.fence, "lost")
            return f"node {call.fence}, where it ran, was lost ({reason}) and is not fenced yet"
        if call.node is not None:
            if call.node in in_service:
                return None
            return f"node {call.node} is out of service ({self._why_out.get(call.node, 'gone')})"
        if in_service:
            return None
        reasons = "; ".join(f"node {i}: {why}" for i, why in sorted(self._why_out.items()))
        return f"no node is in service ({reasons or 'the pool has no nodes'})"

    def slots_freed(self) -> None:
        """Results came back from a node (its agent client calls this from its reader thread,
        ``NodeLaunch.on_results``): the dispatcher may place more."""
        if self._calls:
            with self._lock:
                self._wakeup.notify()

    # ---- state ----------------------------------------------------------------------------

    def load(self) -> tuple[int, int]:
        """Calls waiting for a slot, and calls running on nodes."""
        with self._lock:
            return len(self._calls), sum(node.agent.in_flight for node in self._service)

    def in_flight(self, index: int) -> int:
        """Calls sent to node ``index`` (in service or leaving) and not finished."""
        for node in self._service:
            if node.index == index:
                return node.agent.in_flight
        return 0

    def close(self, reason: str, error: SkywardError | None = None) -> None:
        """Stop dispatching; queued calls fail with ``error`` (by default a
        ``NodeConnectionError`` giving ``reason``; calls already done or cancelled are left
        alone), and so does any call made from now on."""
        with self._lock:
            self._closed = True
            self._closed_by = error
            queued, self._calls = list(self._calls), deque()
            self._wakeup.notify_all()
        fail(queued, error or NodeConnectionError(f"pool {self.identity.stack} closed: {reason}"))
        self.events.flush()

    @property
    def closed(self) -> bool:
        return self._closed
