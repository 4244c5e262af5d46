"""``PoolLifecycle``: one pool's life, from its stack's creation to its destroy.

The one owner of a running pool's parts: the stack, its ``Membership`` and ``Reconciler``, the
``Dispatcher``, the heartbeat, health checks, the autoscaler and the client-side plugins. Every
event that changes the pool's nodes (a lost connection, a failed health check, a preemption
notice, a silent heartbeat, a resize, the autoscaler) goes through here into the membership,
and the reconciler converges. ``close`` runs a ``Teardown`` whose first step registered, and
last run, is the stack's destroy.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from skyward_iac.api.errors import NodeConnectionError, ProvisionError, StackBusyError
from skyward_iac.infra import gc
from skyward_iac.infra.cloud_credentials import require_credentials
from skyward_iac.infra.provider_plugins import require_plugin
from skyward_iac.infra.stack import ClusterStack
from skyward_iac.infra.tags import stack_tags
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.console import acquire_console
from skyward_iac.observability.engine_events import EngineEventTranslator
from skyward_iac.observability.events import (
    ClusterDestroyed,
    ClusterProvisioned,
    ClusterReady,
    ClusterRequested,
    InstancePreempted,
    Log,
    Metric,
)
from skyward_iac.observability.logging import configure_logging
from skyward_iac.orchestration.autoscaler import Autoscaler
from skyward_iac.orchestration.collections import ClientCollections
from skyward_iac.orchestration.dispatch import Dispatcher
from skyward_iac.orchestration.health import HealthMonitor
from skyward_iac.orchestration.heartbeat import Heartbeat
from skyward_iac.orchestration.membership import Membership
from skyward_iac.orchestration.node import Node, NodeLaunch
from skyward_iac.orchestration.notebook import destroy_at_kernel_exit
from skyward_iac.orchestration.plan import PoolPlan
from skyward_iac.orchestration.pool import Pool
from skyward_iac.orchestration.reconciler import Reconciler
from skyward_iac.orchestration.teardown import Teardown
from skyward_iac.plugins import _client as plugins
from skyward_iac.plugins._plugin import Cluster
from skyward_iac.remote.agent_client import Submission, fail
from skyward_iac.remote.protocol import PreemptionNotice

log = logging.getLogger("skyward")


def ending(exc: BaseException | None) -> str:
    """How a run ended, as recorded in the stack's history."""
    if exc is None:
        return "pool closed"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl+C)"
    return f"closed after {type(exc).__name__}"


class PoolLifecycle:
    """Provision, run and tear down one pool (see the module doc)."""

    def __init__(self, plan: PoolPlan, events: EventBus,
                 on_output: Callable[[int, str, str], Any]) -> None:
        self.plan = plan
        self.events = events
        self.on_output = on_output
        self.stack: ClusterStack | None = None
        self.pool: Pool | None = None
        #: Seconds spent in each phase: create, up, nodes (until ready), destroy.
        self.timings: dict[str, float] = {}
        self._teardown = Teardown(plan.stack_name)
        self._started_at = time.monotonic()
        self._ready_at: float | None = None
        self._closed = threading.Event()
        self.dispatcher = Dispatcher(plan.stack_name, plan.options, events)
        self.membership = Membership(plan.bounds, self.dispatcher.serve, self._changed)
        self.heartbeat: Heartbeat | None = None
        self.reconciler: Reconciler | None = None

    # ---- bringing it up ----------------------------------------------------------------------

    def start(self) -> Pool:
        """Create and bring up the stack, wait for ``Nodes.min`` nodes, return the pool; on any
        failure (Ctrl+C included) tear everything down again and raise."""
        plan, name = self.plan, self.plan.stack_name
        # A cloud's provider plugin and credentials are checked before any stack exists.
        require_plugin(plan.provider)
        require_credentials(plan.provider)
        configure_logging(plan.options.logging)
        # In a Jupyter kernel, a reaper destroys the kernel's stacks when it ends (however).
        destroy_at_kernel_exit()
        self._teardown.add("console", acquire_console(plan.options.console, self.events))
        self._teardown.add("destroy", self._destroy)
        try:
            self._provision()
        except BaseException as exc:
            self.events.emit(_error(name, exc))
            self.close(ending(exc))
            raise
        self._ready_at = time.monotonic()
        ready = self.membership.ready_count()
        self.events.emit(ClusterReady(stack=name, nodes=ready,
                                      duration=self._ready_at - self._started_at,
                                      hourly_usd=self.usd_per_hour()))
        log.info("pool %s ready: %d node(s) in %.1fs (%s)", name, ready,
                 self._ready_at - self._started_at,
                 ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        assert self.pool is not None
        return self.pool

    def _provision(self) -> None:
        plan, name, options = self.plan, self.plan.stack_name, self.plan.options
        offer = plan.choice.offer
        accelerator = plan.spec.accelerator
        self.events.emit(ClusterRequested(
            stack=name, provider=plan.provider, nodes=plan.bounds.desired,
            accelerator=accelerator.name if accelerator else None,
            instance_type=offer.instance_type, region=offer.region,
            market=None if plan.provider == "local" else plan.choice.market,
            hourly_usd=self.usd_per_hour()))
        if options.gc_on_start:
            # Other stacks only: it runs beside this pool's provisioning, not before it.
            threading.Thread(target=_collect_garbage, name="skyward-gc", daemon=True).start()
        with self._phase("create"):
            tags = stack_tags(plan.spec, plan.bounds.desired, usd_per_hour=self.usd_per_hour())
            self.stack = ClusterStack.create(plan.request, tags)
        if plan.spec.ttl:
            self.heartbeat = Heartbeat(plan.spec.ttl, self._silent, name)
            self._teardown.add("heartbeat", self.heartbeat.stop)
        launch = self._launch()
        self.reconciler = Reconciler(plan, self.stack, self.membership, self.dispatcher, launch,
                                     self.events.emit, self._node_gone)
        self._teardown.add("stack updates", lambda: self._reconciler_stop())
        log.info("stack %s: bringing up %d node(s)", name, plan.bounds.desired)
        with self._phase("up"):
            self.reconciler.step()  # in this thread: Ctrl+C during `up` lands here
        assert self.reconciler.outputs is not None
        self.events.emit(ClusterProvisioned(stack=name, nodes=plan.bounds.desired,
                                            duration=self.timings["up"]))
        collections = ClientCollections(self.reconciler.outputs, name, self._head,
                                        options.provision_timeout or 600.0)
        self.pool = Pool(plan, self.dispatcher, self.membership, collections, self.events,
                         self.resize)
        self._teardown.add("nodes", self._close_nodes)
        self._teardown.add("collections", collections.close)
        self._teardown.add("queued calls", lambda: self.dispatcher.close("the pool closed"))
        with self._phase("nodes"):
            self._wait_ready()
        self.reconciler.start()
        if options.health_checker is not None:
            health = HealthMonitor(options.health_checker, self.membership.in_service,
                                   options.worker.concurrency, self._unhealthy)
            self._teardown.add("health checks", health.stop)
        if plan.bounds.elastic:
            autoscaler = Autoscaler(self.dispatcher, self.membership, options)
            self._teardown.add("autoscaler", autoscaler.stop)
        client_plugins = contextlib.ExitStack()
        self._teardown.add("plugins", client_plugins.close)
        client_plugins.enter_context(plugins.around_client(
            plan.spec.plugins, self.pool, Cluster(name, plan.spec, plan.bounds.desired)))

    def _launch(self) -> NodeLaunch:
        options = self.plan.options
        return NodeLaunch(
            stack=self.plan.stack_name, ssh_timeout=options.ssh_timeout or 30.0,
            ssh_retry_interval=options.ssh_retry_interval or 1.0, on_output=self._output,
            on_lost=self.node_lost, on_event=self.events.emit,
            on_contact=self.heartbeat.add if self.heartbeat is not None else None,
            on_metrics=self._metrics, on_preemption=self._preempted,
            task_ids=self.dispatcher.task_ids, plugins=self.plan.node_plugins)

    def _output(self, node: int, stream: str, text: str) -> None:
        """A task's output: to the user's sink, and as ``Log`` events to whoever wants them."""
        self.on_output(node, stream, text)
        if self.events.listens(Log):
            for line in text.splitlines():
                self.events.emit(Log(stack=self.plan.stack_name, line=line, node=node,
                                     stream=stream))

    def _metrics(self, node: int, samples: tuple[Any, ...]) -> None:
        # Called by a node's reader thread with ``observability.sampler.MetricSample``s.
        for sample in samples:
            self.events.emit(Metric(stack=self.plan.stack_name, node=node, name=sample.name,
                                    value=sample.value, unit=sample.unit, device=sample.device,
                                    timestamp=sample.timestamp))

    def _wait_ready(self) -> None:
        """Wait until ``Nodes.min`` nodes (any of them) are in service; raise the first start
        error when that can no longer happen."""
        options, bounds = self.plan.options, self.plan.bounds
        timeout = (options.provision_timeout or 600.0) + (options.bootstrap_timeout or 0) \
            + self.plan.spec.image.bootstrap_timeout
        if self.membership.wait_ready(bounds.ready_at, timeout):
            return
        assert self.reconciler is not None
        errors = self.reconciler.start_errors
        if errors:
            raise next(iter(errors.values()))
        raise NodeConnectionError(
            f"pool {self.plan.stack_name}: only {self.membership.ready_count()} of "
            f"{bounds.ready_at} node(s) ready after {timeout:.0f}s "
            f"({self.membership.failures() or 'still starting'})")

    # ---- what changes the pool's nodes ------------------------------------------------------

    def _changed(self) -> None:
        if self.reconciler is not None:
            self.reconciler.wake()

    def resize(self, desired: int, floor: int | None = None, ceiling: int | None = None,
               wait: bool = True) -> None:
        """Want ``desired`` nodes (and new bounds); the reconciler converges. With ``wait``,
        return once the stack declares them and each is in service (or given up: then
        ``ProvisionError`` says why)."""
        self.membership.set_target(desired, floor, ceiling)
        if not wait:
            return
        options = self.plan.options
        timeout = (options.provision_timeout or 600.0) + self.plan.spec.image.bootstrap_timeout
        if not self.membership.wait_settled(timeout):
            raise NodeConnectionError(
                f"pool {self.plan.stack_name}: resize to {desired} node(s) not done after "
                f"{timeout:.0f}s ({self.membership.stopped or self.membership.failures()})")
        if failed := self.membership.failures():
            raise ProvisionError(f"pool {self.plan.stack_name}: resize to {desired} node(s): "
                                 + "; ".join(f"node {i}: {why}" for i, why in failed.items()))

    def node_lost(self, index: int, submissions: list[Submission], reason: str) -> None:
        """A node's connection broke (its agent client reports it with its unfinished calls)."""
        self._out_of_service(index, reason, submissions)

    def _unhealthy(self, index: int, reason: str) -> None:
        self._out_of_service(index, reason, [])

    def _preempted(self, index: int, notice: PreemptionNotice) -> None:
        left = max(0.0, notice.deadline - time.time())
        self._out_of_service(index, f"{notice.reason}; it stops in {left:.0f}s", [])

    def _silent(self, index: int, reason: str) -> None:
        self._out_of_service(index, reason, [])

    def _out_of_service(self, index: int, reason: str, lost: list[Submission]) -> None:
        """The one path for every node that leaves service unexpectedly: out of service first,
        its unfinished calls handed to the dispatcher (held until it is fenced), then fenced
        over SSH if it still answers, and recreated by the reconciler."""
        node = self.membership.lose(index, reason)
        self.dispatcher.out_of_service(index, reason)
        if node is not None:
            lost = lost + node.agent.close()
        self.dispatcher.lost(index, lost, reason)
        if node is None:
            return
        log.warning("stack %s: node %d out of service (%s); replacing it", self.plan.stack_name,
                    index, reason)
        self.events.emit(InstancePreempted(stack=self.plan.stack_name, node=index, reason=reason))
        threading.Thread(target=self._fence, args=(node,), name=f"fence-node-{index}",
                         daemon=True).start()

    def _fence(self, node: Node) -> None:
        """Kill what is left of a lost node over SSH; if that works its calls run again at
        once, otherwise when the stack update that recreates it has removed it."""
        if node.fence():
            self.dispatcher.fenced(node.index)
        self._node_gone(node.index, node.connection)
        try:
            node.close()
        except Exception as exc:  # noqa: BLE001 - it is being replaced anyway
            log.debug("node %d: closing after it was lost: %s", node.index, exc)

    def _node_gone(self, index: int, connection: Any) -> None:
        if self.heartbeat is not None:
            self.heartbeat.remove(index, connection)

    def _head(self, timeout: float) -> Node:
        """The head node once it is in service (collections are reached through it)."""
        deadline = time.monotonic() + timeout
        while True:
            for node in self.membership.in_service():
                if node.index == 0:
                    return node
            if self.membership.stopped or time.monotonic() > deadline:
                raise NodeConnectionError(
                    f"pool {self.plan.stack_name}: the head node (etcd) was not in service "
                    f"within {timeout:.0f}s")
            time.sleep(0.1)

    # ---- taking it down ---------------------------------------------------------------------

    def close(self, how: str = "pool closed") -> None:
        """Tear the pool down; the stack's destroy always runs, the first error is raised
        after it. Safe to call twice."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.membership.stop(how)
        self._how = how
        self._teardown.run()

    def _reconciler_stop(self) -> None:
        if self.reconciler is not None:
            self.reconciler.stop(self.plan.options.shutdown_timeout)

    def _close_nodes(self) -> None:
        """Close every node's connections (and unmount volumes); their unfinished calls fail."""
        error = NodeConnectionError(f"pool {self.plan.stack_name} closed")
        for node in self.membership.nodes():
            fail(node.close(), error)

    def _destroy(self) -> None:
        stack = self.stack
        if stack is None:
            return
        name, how = self.plan.stack_name, getattr(self, "_how", "pool closed")
        log.info("stack %s: destroying (%s)", name, how)
        with self._phase("destroy"):
            _destroy(stack, f"skyward: {how}", self.plan.options.shutdown_timeout,
                     EngineEventTranslator(name, "destroy", self.events.emit))
        uptime = time.monotonic() - self._started_at
        log.info("stack %s: destroyed in %.1fs", name, self.timings["destroy"])
        self.events.emit(ClusterDestroyed(stack=name, duration=self.timings["destroy"],
                                          uptime=uptime,
                                          cost_usd=self.usd_per_hour() * uptime / 3600))
        self.stack = None

    # ---- small things --------------------------------------------------------------------------

    def usd_per_hour(self) -> float:
        request = self.reconciler.request if self.reconciler is not None else self.plan.request
        return self.plan.usd_per_hour(request)

    @contextlib.contextmanager
    def _phase(self, name: str):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - started


def _destroy(stack: ClusterStack, message: str, patience: float, on_event: Any) -> None:
    """Destroy ``stack``; after Ctrl+C the engine may still finish an interrupted update and
    hold the lock for a moment: wait for it (bounded), and clear a lock whose holder died."""
    deadline = time.monotonic() + patience
    while True:
        try:
            stack.destroy(message=message, on_event=on_event)
            return
        except StackBusyError:
            if time.monotonic() > deadline:
                raise
            if stack.stale_locks():
                stack.clear_crash_leftovers()
            time.sleep(0.5)


def _collect_garbage() -> None:
    try:
        for action in gc.collect(retention_days=None, this_host_only=True):
            log.info("gc: %s %s (%s)", action.action, action.stack, action.reason)
    except Exception as exc:  # noqa: BLE001 - a failed cleanup must not block new work
        log.warning("gc before start failed: %s", exc)


def _error(stack: str, exc: BaseException) -> Any:
    from skyward_iac.observability.events import Error

    return Error(stack=stack, message=str(exc) or repr(exc), fatal=True)
