"""``PoolParts``: one pool's parts, built together by one factory from a settled plan.

The parts: the ``CostMeter`` and the ``BudgetGuard`` watching it, the ``Dispatcher`` (queue,
placement, retries), the ``Membership`` (who is in the pool), the ``NodeEvents`` every node
reports to (``NodeLaunch``: where each node's agent callbacks come from), the ``Heartbeat``,
the lease (``LeaseRenewer``) and the ``Reconciler``; once the first nodes are in service, the
collections tunnel and the ``Pool`` (``serve``), then health checks, the autoscaler and the
client plugins (``watch``). They share one ``PoolIdentity`` by reference. Each registers its
stop in the parts' ``Teardown`` under the phase it declares (``teardown.Phase``), so the order
they stop in is written once, not implied by the order they were built in.

A plan is settled before its parts are built: a pool adopting a warm pool's stack builds them
for that stack. If the adoption fails, ``discard`` stops them all, leaving the warm nodes as
they are (the keeper's again), and a cold start builds new ones.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from skyward_iac.api.errors import BudgetExceededError, NodeConnectionError, ProvisionError
from skyward_iac.api.plugin import Cluster
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks.leases import LeaseRenewer
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.observability.bus import EventBus
from skyward_iac.orchestration import descriptors
from skyward_iac.orchestration.autoscaler import Autoscaler
from skyward_iac.orchestration.budget import BudgetGuard, NoBudget
from skyward_iac.orchestration.collections import ClientCollections
from skyward_iac.orchestration.cost import CostMeter
from skyward_iac.orchestration.dispatch import Dispatcher
from skyward_iac.orchestration.health import HealthMonitor
from skyward_iac.orchestration.heartbeat import Heartbeat
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.membership import Membership
from skyward_iac.orchestration.node import Node
from skyward_iac.orchestration.node_events import NodeEvents
from skyward_iac.orchestration.plan import PoolPlan
from skyward_iac.orchestration.pool import Pool
from skyward_iac.orchestration.reconciler import Reconciler
from skyward_iac.orchestration.run_record import run_tags
from skyward_iac.orchestration.teardown import Phase, Teardown
from skyward_iac.plugins import _client as plugins
from skyward_iac.remote.agent_client import fail

log = logging.getLogger("skyward")


class PoolParts:
    """A pool's parts for one settled plan and its stack (see the module doc)."""

    def __init__(self, plan: PoolPlan, stack: ClusterStack, events: EventBus,
                 on_output: Callable[[int, str, str], Any],
                 on_spent: Callable[[BudgetExceededError], Any]) -> None:
        self.identity = PoolIdentity(plan.stack_name, plan.run_id)
        self.stack, self.events = stack, events
        self.teardown = Teardown(self.identity)
        #: Set when the budget is spent: what pending calls and a failed start raise.
        self.failure: BudgetExceededError | None = None
        #: Whether closing leaves the nodes running (kept warm, or a failed adoption's).
        self.keep_nodes = False
        self.pool: Pool | None = None
        self._on_spent = on_spent
        try:
            self._build(plan, on_output)
        except BaseException:
            self.discard("its parts could not be built")  # those built so far
            raise

    def _build(self, plan: PoolPlan, on_output: Callable[[int, str, str], Any]) -> None:
        options, stack, events = plan.options, self.stack, self.events
        descriptors.make_room(plan.bounds.ceiling)
        #: USD so far, at the rate of whatever the stack declares (``_applied``).
        self.cost = CostMeter(plan.usd_per_hour(plan.request), nodes=plan.request.node_count)
        self._tagged = run_tags(plan, plan.request, self.cost)
        self.budget: BudgetGuard | None = None
        if options.max_cost_usd is not None:
            self.budget = BudgetGuard(options.max_cost_usd, self.cost, self.identity,
                                      events, self._spent)
            self.teardown.add(Phase.WATCHERS, "budget", self.budget.stop)
        self.dispatcher = Dispatcher(self.identity, options, events)
        self.teardown.add(Phase.CALLS, "queued calls",
                          lambda: self.dispatcher.close("the pool closed", self.failure))
        self.membership = Membership(plan.bounds, self.dispatcher.serve, self._changed)
        self.nodes = NodeEvents(self.identity, self.membership, self.dispatcher, events,
                                on_output)
        self.teardown.add(Phase.NODES, "nodes", self._close_nodes)
        self.lease: LeaseRenewer | None = None
        if plan.spec.ttl:
            self.nodes.heartbeat = Heartbeat(plan.spec.ttl, self.nodes.silent, self.identity,
                                             self.budget or NoBudget())
            self.teardown.add(Phase.HEARTBEAT, "heartbeat", self.nodes.heartbeat.stop)
            self.lease = LeaseRenewer(self.identity.stack, plan.spec.ttl, stack.renew_lease)
            self.teardown.add(Phase.LEASE, "lease", self.lease.stop)
            self.lease.start()
        launch = self.nodes.launch(options.ssh_timeout, options.ssh_retry_interval,
                                   plan.node_plugins)
        self.reconciler = Reconciler(plan, stack, self.membership, self.dispatcher, launch,
                                     events, self.nodes.gone)
        self.reconciler.on_applied = self._applied
        self.teardown.add(Phase.UPDATES, "stack updates",
                          lambda: self.reconciler.stop(options.shutdown_timeout))

    @property
    def plan(self) -> PoolPlan:
        """The plan in force (capacity failover may have moved the pool: zone, region, Spec)."""
        return self.reconciler.plan

    def usd_per_hour(self) -> float:
        """What the nodes the stack declares now cost an hour."""
        return self.plan.usd_per_hour(self.reconciler.request)

    # ---- serving ----------------------------------------------------------------------------

    def serve(self) -> Pool:
        """The user's ``Pool`` and its collections tunnel (the stack's latest outputs: a
        replaced head has a new address, so a new etcd CA)."""
        plan, reconciler = self.plan, self.reconciler
        assert reconciler.outputs is not None
        first = reconciler.outputs
        collections = ClientCollections(lambda: reconciler.outputs or first, self.identity,
                                        self.head, plan.options.provision_timeout,
                                        self.events.emit)
        self.teardown.add(Phase.COLLECTIONS, "collections", collections.close)
        self.pool = Pool(plan, self.dispatcher, self.membership, collections, self.events,
                         self.resize)
        return self.pool

    def watch(self) -> None:
        """Once the pool is ready: converge in the background, and start what watches it (health
        checks, the autoscaler) and the client plugins' ``around_client``."""
        plan, options = self.plan, self.plan.options
        assert self.pool is not None
        self.reconciler.start()
        if options.health_checker is not None:
            health = HealthMonitor(options.health_checker, self.membership.in_service,
                                   options.worker.concurrency, self.nodes.unhealthy)
            self.teardown.add(Phase.WATCHERS, "health checks", health.stop)
        if plan.bounds.elastic:
            autoscaler = Autoscaler(self.dispatcher, self.membership, options)
            self.teardown.add(Phase.WATCHERS, "autoscaler", autoscaler.stop)
        client_plugins = contextlib.ExitStack()
        self.teardown.add(Phase.PLUGINS, "plugins", client_plugins.close)
        client_plugins.enter_context(plugins.around_client(
            plan.spec.plugins, self.pool, Cluster(self.identity.stack, plan.spec,
                                                  plan.bounds.desired)))

    def wait_ready(self, count: int, timeout: float) -> None:
        """Wait until ``count`` nodes (any of them) are in service; raise the first start
        error when that can no longer happen."""
        if self.membership.wait_ready(count, timeout):
            return
        if errors := self.reconciler.start_errors:
            raise next(iter(errors.values()))
        raise NodeConnectionError(
            f"pool {self.identity.stack}: only {self.membership.ready_count()} of {count} "
            f"node(s) ready after {timeout:.0f}s ({self.membership.failures() or 'still starting'})")

    def resize(self, desired: int, floor: int | None = None, ceiling: int | None = None,
               wait: bool = True) -> None:
        """Want ``desired`` nodes (and new bounds); the reconciler converges. With ``wait``,
        return once the stack declares them and each is in service (or given up: then
        ``ProvisionError`` says why)."""
        self.membership.set_target(desired, floor, ceiling)
        if not wait:
            return
        name, options = self.identity.stack, self.plan.options
        timeout = options.provision_timeout + self.plan.spec.image.bootstrap_timeout
        if not self.membership.wait_settled(timeout):
            raise NodeConnectionError(
                f"pool {name}: resize to {desired} node(s) not done after {timeout:.0f}s "
                f"({self.membership.stopped or self.membership.failures()})")
        if failed := self.membership.failures():
            raise ProvisionError(f"pool {name}: resize to {desired} node(s): "
                                 + "; ".join(f"node {i}: {why}" for i, why in failed.items()))

    def head(self, timeout: float) -> Node:
        """The head node once it is in service (collections are reached through it)."""
        deadline = time.monotonic() + timeout
        while True:
            for node in self.membership.in_service():
                if node.index == 0:
                    return node
            if self.membership.stopped or time.monotonic() > deadline:
                raise NodeConnectionError(
                    f"pool {self.identity.stack}: the head node (etcd) was not in service "
                    f"within {timeout:.0f}s")
            time.sleep(0.1)

    def can_keep_warm(self) -> bool:
        """Whether the nodes are fit for the next equal pool: every declared node in service,
        the stack declaring what is desired, nothing stopped the pool."""
        membership = self.membership
        return (self.reconciler.outputs is not None and not membership.stopped
                and membership.ready_count() == membership.declared > 0
                and membership.declared == membership.desired)

    # ---- ending -----------------------------------------------------------------------------

    def discard(self, why: str) -> None:
        """Stop every part, leaving the nodes running (a failed adoption: they are the
        keeper's again); what fails is logged."""
        self.keep_nodes = True
        if hasattr(self, "membership"):
            self.membership.stop(why)
        try:
            self.teardown.run()
        except Exception as exc:  # noqa: BLE001 - logged by the teardown; the pool goes on
            log.debug("stack %s: discarding the adoption's parts: %s", self.identity.stack, exc)

    def _close_nodes(self) -> None:
        """Close every node's connections (and unmount volumes, unless the nodes are kept);
        their unfinished calls fail."""
        error = self.failure or NodeConnectionError(f"pool {self.identity.stack} closed")
        for node in self.membership.nodes():
            fail(node.detach() if self.keep_nodes else node.close(), error)

    def _spent(self, error: BudgetExceededError) -> None:
        """The budget is spent: no node joins any more, a start under way fails with
        ``error``, and so do pending calls; the sequencer closes a pool handed over."""
        self.failure = error
        self.membership.stop(str(error))
        self._on_spent(error)

    def _changed(self) -> None:
        if hasattr(self, "reconciler"):  # built after the membership that calls this
            self.reconciler.wake()

    def _applied(self, request: ClusterRequest) -> None:
        """A stack update put ``request`` in force: the cost meter runs at its rate, and the
        stack's run tags say what it declares now, where, and its nodes over time."""
        self.cost.set_rate(self.plan.usd_per_hour(request), request.node_count)
        tagged = run_tags(self.plan, request, self.cost, self.stack.zones())
        if tagged == self._tagged:
            return
        try:
            self.stack.update_tags(tagged)
            self._tagged = tagged
        except Exception as exc:  # noqa: BLE001 - a stale tag must not stop the pool
            log.warning("stack %s: updating its tags failed: %s", self.identity.stack, exc)
