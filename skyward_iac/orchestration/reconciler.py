"""``Reconciler``: brings a pool's stack and nodes to what its ``Membership`` declares.

One converge step at a time, in one thread: drain the nodes a shrink removes; one stack update
(with the engine's events on the console) declaring the new count and recreating lost nodes;
tell the nodes in service their new peers; bootstrap the new nodes in the background, each
joining the pool as it is ready. A lost node's old instance is gone once the update that
recreates it succeeds: that fences it, and its held calls may run again. A step that fails
is retried with backoff; a node that fails to start is recreated with backoff, and given up
after ``max_provision_attempts`` in a row; a stack update the cloud refuses tries the next
places, each one attempt of one bounded sequence. The numbers are ``api/retry.py``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward_iac.api import retry
from skyward_iac.api.retry import Attempts, RetryPolicy
from skyward_iac.infra.capacity.failover import (
    Alternative,
    alternatives,
    spec_alternatives,
    up_with_failover,
)
from skyward_iac.infra.capacity.spot_fallback import up_with_spot_fallback
from skyward_iac.infra.engine.command import stopped_on_purpose
from skyward_iac.infra.engine.provider_plugins import require_plugin
from skyward_iac.infra.identity.cloud_credentials import require_credentials
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.engine_events import EngineEventTranslator
from skyward_iac.observability.events import (
    Error,
    Event,
    InstanceReplaced,
    Log,
    ProvisionRetried,
)
from skyward_iac.orchestration.dispatch import Dispatcher
from skyward_iac.orchestration.elastic import ElasticThreads
from skyward_iac.orchestration.membership import ConvergeStep, Membership, converge_step, next_retry
from skyward_iac.orchestration.node import Node, NodeLaunch
from skyward_iac.orchestration.plan import PoolPlan
from skyward_iac.outputs import ClusterOutputs

log = logging.getLogger("skyward")
#: Attaching a warm pool's node is tried once: a failure falls back to a cold start.
ATTACH = RetryPolicy("attach", attempts=1)


class Reconciler:
    """Converges one pool (see the module doc). ``step()`` runs one step in the caller's
    thread (the first ``up``, so Ctrl+C reaches it); ``start()`` runs the rest in a thread."""

    def __init__(self, plan: PoolPlan, stack: ClusterStack, membership: Membership,
                 dispatcher: Dispatcher, launch: NodeLaunch, events: EventBus,
                 on_node_gone: Callable[[int, Any], Any] | None = None) -> None:
        #: The plan in force: capacity failover moves it (``_up``); its stack stays the one
        #: the pool's identity names (``launch.identity``, shared with every other part).
        self.plan = plan
        self.identity = launch.identity
        self.stack = stack
        self.membership = membership
        self.dispatcher = dispatcher
        self.launch = launch
        self.events = events
        self.emit: Callable[[Event], Any] = events.emit
        #: Called with (index, connection) when a node leaves for good (stop its heartbeat).
        self.on_node_gone = on_node_gone
        #: Called with the request each stack update put in force (its size, its fallbacks).
        self.on_applied: Callable[[ClusterRequest], Any] | None = None
        #: The request in force (with any fallback it took) and the last update's outputs.
        self.request = plan.request
        self.outputs: ClusterOutputs | None = None
        #: Why the first start of each node failed (``provision`` raises the first).
        self.start_errors: dict[int, BaseException] = {}
        self._wake = threading.Event()
        self._busy = threading.Lock()
        self._stopped = threading.Event()
        # Node starts run 32 at a time; the threads end when idle (a pool's threads must not
        # stay at what one burst of starts needed).
        self._starts = ElasticThreads(32, name=f"{self.identity.stack}-node")
        self._thread: threading.Thread | None = None
        self._previous: dict[int, str] = {}

    # ---- running -------------------------------------------------------------------------

    def wake(self) -> None:
        """The declared state changed: look again."""
        self._wake.set()

    def start(self) -> None:
        """Converge in a background thread from now on."""
        self._thread = threading.Thread(target=self._run, name=f"{self.identity.stack}-converge",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop converging; a stack update under way is waited for (up to ``timeout``)."""
        self._stopped.set()
        self._wake.set()
        if self._busy.acquire(timeout=timeout):
            self._busy.release()
        self._starts.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            phases = self.membership.phases()
            due = next_retry(phases, self.membership.declared, self.membership.desired)
            wait = None if due is None else max(0.0, due - time.monotonic())
            backoff = retry.for_converge(self.plan.options).delay_before(failures + 1)
            self._wake.wait(wait if failures == 0 else max(wait or 0.0, backoff))
            self._wake.clear()
            if self._stopped.is_set() or self.membership.stopped:
                return
            try:
                self.step()
                failures = 0
            except Exception as exc:  # noqa: BLE001 - reported, retried with backoff
                if why := stopped_on_purpose(self.identity.stack):
                    log.info("stack %s: the update under way was stopped: %s",
                             self.identity.stack, why)
                    return
                failures += 1
                self.events.report(
                    Error(stack=self.identity.stack,
                          message=f"converging failed (attempt {failures}): {exc}"),
                    log, logging.ERROR, "stack %s: converging failed (attempt %d): %s",
                    self.identity.stack, failures, exc)

    # ---- one step ------------------------------------------------------------------------

    def step(self) -> bool:
        """Run the next converge step now, if any; True when one ran."""
        with self._busy:
            if self._stopped.is_set():
                return False
            declared = self.membership.declared
            step = converge_step(declared, self.membership.desired, self.membership.phases(),
                                 time.monotonic())
            if step is None:
                return False
            if self.outputs is not None and (who := self._taken_down_by()):
                self._taken_down(f"stack {self.identity.stack} was taken down by {who}; the "
                                 "pool stops")
                return False
            self._converge(step, declared)
            return True

    def _converge(self, step: ConvergeStep, declared: int) -> None:
        name = self.identity.stack
        self._drain(self.membership.leaving(step.retire))
        self._previous = {i: self.outputs.node(i).public_address for i in step.replace
                          if self.outputs is not None}
        request = self.plan.request_for(self.request, step.node_count)
        self.stack.set_request(request)
        log.info("stack %s: %s", name, step.describe(declared).removeprefix("skyward: "))
        translator = EngineEventTranslator(name, "up", self._engine_event)
        outputs, self.request = self._up(request, translator, message=step.describe(declared),
                                         replace_nodes=step.replace)
        self.outputs = outputs
        if self.on_applied is not None:
            self.on_applied(self.request)
        # The update recreated the lost nodes and removed the retired ones: none of their old
        # processes runs any more, so their held calls may go elsewhere.
        for index in (*step.replace, *step.retire):
            self.dispatcher.fenced(index)
        for node in self.membership.declared_now(step.node_count, step.start):
            self._close(node)
        self._tell_peers(outputs)
        for index in step.start:
            self._starts.submit(self._start, index, outputs)

    def _up(self, request: ClusterRequest, translator: EngineEventTranslator,
            **up_options: Any) -> tuple[ClusterOutputs, ClusterRequest]:
        """One stack update and, while the cloud refuses it, the next places: refused nodes
        moved (``infra/capacity/spot_fallback.py``) and, for a pool none of whose nodes exists
        yet, the pool moved to the next zone, region or Spec (``infra/capacity/failover.py``).
        Every place is one attempt of one sequence (``api/retry.for_provision``), announced
        by a ``ProvisionRetried``."""
        places = [] if self.outputs is not None else (
            alternatives(request) + spec_alternatives(request, self._usable_fallbacks()))
        policy = retry.for_provision(self.plan.options)
        attempts = Attempts(policy.attempts)

        def retried(moved: ClusterRequest, attempt: int, reason: str, why: str) -> None:
            self.emit(ProvisionRetried(stack=self.identity.stack, attempt=attempt,
                                       reason=reason,
                                       region=moved.offer.region if moved.offer else "",
                                       zone=moved.zone, why=why))
            time.sleep(policy.delay_before(attempt))

        def up(attempted: ClusterRequest, zone_next: bool) -> tuple[ClusterOutputs,
                                                                    ClusterRequest]:
            return up_with_spot_fallback(self.stack, attempted, translator,
                                         defer_zonal=zone_next, attempts=attempts,
                                         on_retry=retried, **up_options)

        def move(moved: ClusterRequest, place: Alternative, attempt: int, reason: str) -> None:
            log.warning("stack %s: no capacity (%s); trying %s (%s), place %d of at most %d",
                        self.identity.stack, reason, place.where, place.why, attempt,
                        policy.attempts)
            self.plan = self.plan.moved_to(moved)
            self.stack.set_request(moved)
            retried(moved, attempt, reason, place.why)

        (outputs, in_force), _ = up_with_failover(up, request, places, attempts, move)
        return outputs, in_force

    def _usable_fallbacks(self) -> list[Any]:
        """The plan's fallback Specs whose provider plugin and credentials are here."""
        usable = []
        for choice in self.plan.fallbacks:
            try:
                require_plugin(choice.spec.provider.kind)
                require_credentials(choice.spec.provider.kind)
            except Exception as exc:  # noqa: BLE001 - that Spec cannot be tried here
                log.info("stack %s: fallback Spec %s left out: %s", self.identity.stack,
                         choice.spec.provider.kind, exc)
                continue
            usable.append(choice)
        return usable

    def _engine_event(self, event: Event) -> None:
        # The pool says a node was replaced once its replacement is in service, not when the
        # engine recreated its instance.
        if isinstance(event, InstanceReplaced):
            return
        if isinstance(event, Error | Log) and stopped_on_purpose(self.identity.stack):
            # What an engine stopped on purpose says about it (its cancel, the program's
            # traceback) is expected: the pool says why, once (``_run``).
            log.debug("stack %s: %s", self.identity.stack, event)
            return
        self.emit(event)

    def _drain(self, nodes: list[Node]) -> None:
        """Let leaving nodes finish their calls (bounded), then close them."""
        deadline = time.monotonic() + self.plan.options.shutdown_timeout
        for node in nodes:
            while node.agent.in_flight and time.monotonic() < deadline:
                time.sleep(0.05)
            pending = self._close(node)
            if pending:  # what did not finish in time runs again elsewhere, once it is gone
                self.dispatcher.lost(node.index, pending, "removed by a resize")

    def _close(self, node: Node) -> list[Any]:
        if self.on_node_gone is not None:
            self.on_node_gone(node.index, node.connection)
        try:
            return node.close()
        except Exception as exc:  # noqa: BLE001 - it is going away anyway
            log.warning("node %d: closing failed: %s", node.index, exc)
            return []

    def _tell_peers(self, outputs: ClusterOutputs) -> None:
        infos = self.plan.instance_infos(outputs)
        collections = self.plan.collections_config(outputs)
        for node in self.membership.in_service():
            if self.membership.stopped:
                return  # the pool is closing (its nodes close before a running update ends)
            if node.index in infos:
                try:
                    node.configure(infos[node.index], collections)
                except OSError as exc:
                    if self.membership.stopped:
                        return  # closed under us by the pool's close: nothing is wrong
                    # Its reader reports it lost; it gets replaced.
                    log.warning("node %d missed the new peer list: %s", node.index, exc)

    def _start(self, index: int, outputs: ClusterOutputs) -> None:
        """Bring node ``index`` into service (in a start thread)."""
        name = self.identity.stack
        try:
            address = outputs.node(index)
            node = Node.start(self.launch, outputs, address,
                              self.plan.bootstrap_plan(address, outputs),
                              self.plan.instance_infos(outputs)[index],
                              self.plan.collections_config(outputs))
        except BaseException as exc:  # noqa: BLE001 - reported; recreated with backoff
            self.start_errors.setdefault(index, exc)
            if self.on_node_gone is not None:
                self.on_node_gone(index, None)
            if self._stopped.is_set() or self.membership.stopped:
                return
            gave_up = self.membership.start_failed(
                index, f"{type(exc).__name__}: {exc}", retry.for_node_start(self.plan.options))
            if self._thread is None and not self.membership.can_reach(self.plan.bounds.ready_at):
                # The pool is starting and cannot any more: its start fails with this error,
                # reported there (FATAL) and raised; "it will be recreated" would be untrue.
                log.info("stack %s: node %d failed to start, so the pool cannot: %s", name,
                         index, exc)
                return
            what = "giving up on it" if gave_up else "it will be recreated"
            self.events.report(
                Error(stack=name, node=index, message=f"node {index} failed to start ({what}): "
                                                      f"{exc}"),
                log, logging.ERROR, "stack %s: node %d failed to start (%s): %s", name, index,
                what, exc)
            return
        if not self.membership.joined(index, node):
            self._close(node)  # no longer wanted (shrunk, or the pool is closing)
            return
        log.info("stack %s: node %d in service (%d ready)", name, index,
                 self.membership.ready_count())
        if index in self._previous:
            self.emit(InstanceReplaced(stack=name, node=index,
                                       old_instance_id=self._previous.pop(index),
                                       instance_id=address.public_address))

    # ---- a warm pool ------------------------------------------------------------------------

    def adopt(self, outputs: ClusterOutputs, ports: dict[int, int]) -> None:
        """Take over nodes that are up and bootstrapped (a warm pool's): the stack declares
        ``plan.request``'s nodes already; each is reattached in the background."""
        self.outputs = outputs
        self.request = self.plan.request
        count = self.request.node_count
        self.membership.declared_now(count, tuple(range(count)))
        for index in range(count):
            self._starts.submit(self._attach, index, outputs, ports[index])

    def _attach(self, index: int, outputs: ClusterOutputs, port: int) -> None:
        try:
            address = outputs.node(index)
            node = Node.attach(self.launch, outputs, address, port,
                               self.plan.bootstrap_plan(address, outputs),
                               self.plan.instance_infos(outputs)[index],
                               self.plan.collections_config(outputs))
        except Exception as exc:  # noqa: BLE001 - the caller falls back to a cold start
            self.start_errors.setdefault(index, exc)
            self.membership.start_failed(index, f"{type(exc).__name__}: {exc}", ATTACH)
            return
        if not self.membership.joined(index, node):
            node.detach()

    # ---- a stack taken down by someone else --------------------------------------------------

    def _taken_down_by(self) -> str | None:
        """Who took this stack down (``skyward-iac down --force`` or gc tag it first), or None:
        such a stack must not be brought back by a replacement."""
        return self.stack.tags().get("down_by") or None

    def _taken_down(self, reason: str) -> None:
        self.events.report(Error(stack=self.identity.stack, message=reason, fatal=True), log,
                           logging.ERROR, "stack %s: %s", self.identity.stack, reason)
        self.membership.stop(reason)
        self.dispatcher.close(reason)
