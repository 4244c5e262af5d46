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
from collections.abc import Callable, Iterator
from typing import Any

from skyward_iac.api.errors import (
    BudgetExceededError,
    NodeConnectionError,
    ProvisionError,
    StackBusyError,
)
from skyward_iac.api.plugin import Cluster
from skyward_iac.infra.engine.command import completed
from skyward_iac.infra.engine.provider_plugins import require_plugin
from skyward_iac.infra.identity.cloud_credentials import require_credentials
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks import gc
from skyward_iac.infra.stacks.leases import LeaseRenewer
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.infra.stacks.tags import stack_tags
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.console import acquire_console
from skyward_iac.observability.engine_events import EngineEventTranslator
from skyward_iac.observability.events import (
    ClusterDestroyed,
    ClusterProvisioned,
    ClusterReady,
    ClusterRequested,
    Error,
)
from skyward_iac.observability.logging import configure_logging
from skyward_iac.orchestration import interrupts, reviewed, warm
from skyward_iac.orchestration.autoscaler import Autoscaler
from skyward_iac.orchestration.budget import BudgetGuard, NoBudget
from skyward_iac.orchestration.collections import ClientCollections
from skyward_iac.orchestration.cost import CostMeter
from skyward_iac.orchestration.dispatch import Dispatcher
from skyward_iac.orchestration.health import HealthMonitor
from skyward_iac.orchestration.heartbeat import Heartbeat
from skyward_iac.orchestration.keeper import start_keeper
from skyward_iac.orchestration.membership import Membership
from skyward_iac.orchestration.node import Node
from skyward_iac.orchestration.node_events import NodeEvents
from skyward_iac.orchestration.notebook import destroy_at_kernel_exit
from skyward_iac.orchestration.plan import PoolPlan
from skyward_iac.orchestration.pool import Pool
from skyward_iac.orchestration.reconciler import Reconciler
from skyward_iac.orchestration.teardown import Teardown
from skyward_iac.plugins import _client as plugins
from skyward_iac.remote.agent_client import fail

log = logging.getLogger("skyward")


def ending(exc: BaseException | None) -> str:
    """How a run ended, as recorded in the stack's history."""
    if exc is None:
        return "pool closed"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl+C)"
    if isinstance(exc, BudgetExceededError):
        return f"budget spent: ${exc.spent_usd:.2f} of Options(max_cost_usd={exc.budget_usd:g})"
    return f"closed after {type(exc).__name__}"


class PoolLifecycle:
    """Provision (or adopt), run and tear down (or keep warm) one pool; see the module doc."""

    def __init__(self, plan: PoolPlan, events: EventBus,
                 on_output: Callable[[int, str, str], Any]) -> None:
        self.plan = plan
        self.events = events
        self.stack: ClusterStack | None = None
        self._lease: LeaseRenewer | None = None
        self.pool: Pool | None = None
        #: Seconds spent in each phase: create, up, nodes (until ready), destroy.
        self.timings: dict[str, float] = {}
        self._teardown = Teardown(plan.stack_name)
        self._started_at = time.monotonic()
        #: Since when the stack runs: this pool's start, or a warm pool's first (adopted).
        self._up_from, self._up_since = self._started_at, time.time()
        #: USD so far, from launch, at the rate of whatever the stack declares (``_applied``).
        self.cost = CostMeter(plan.usd_per_hour(plan.request))
        self._tagged = (plan.bounds.desired, f"{self.cost.rate:.4f}")
        self._ready_at: float | None = None
        self._closed = threading.Event()
        self._torn_down = threading.Event()
        self._how = "pool closed"
        #: Set when the budget is spent: what pending calls and a failed start raise.
        self._failure: BudgetExceededError | None = None
        self._budget: BudgetGuard | None = None
        self.dispatcher = Dispatcher(plan.stack_name, plan.options, events)
        self.membership = Membership(plan.bounds, self.dispatcher.serve, self._changed)
        self.nodes = NodeEvents(plan.stack_name, self.membership, self.dispatcher, events,
                                on_output)
        self.reconciler: Reconciler | None = None
        #: Whether this pool was adopted warm, and whether it is left warm at close.
        self.adopted = False
        self._kept_warm = False

    # ---- bringing it up ----------------------------------------------------------------------

    def start(self) -> Pool:
        """Adopt a warm pool of the same kind, or create and bring up the stack; wait for
        ``Nodes.min`` nodes; return the pool. On any failure (Ctrl+C included) tear everything
        down again and raise."""
        plan = self.plan
        # A cloud's provider plugin and credentials are checked before any stack exists.
        require_plugin(plan.provider)
        require_credentials(plan.provider)
        configure_logging(plan.options.logging)
        # In a Jupyter kernel, a reaper destroys the kernel's stacks when it ends (however).
        destroy_at_kernel_exit()
        # A Ctrl+C that ends the script ends the process by SIGINT, whatever runs at exit.
        interrupts.install()
        self._teardown.add("console", acquire_console(plan.options.console, self.events))
        self._teardown.add("destroy", self._destroy_or_keep)
        if plan.options.max_cost_usd is not None:
            self._budget = BudgetGuard(plan.options.max_cost_usd, self.cost, plan.stack_name,
                                       self.events, self._over_budget)
            self._teardown.add("budget", self._budget.stop)
        try:
            # A reviewed plan brings up its own stack, once: adopting another warm pool would
            # run what nobody reviewed, and its own warm pool is the plan applied already.
            claim = None if plan.reviewed is not None else warm.claim(plan.warm_key)
            if claim is None or not self._adopt(claim):
                self._provision()
            self._run()
        except BaseException as exc:
            spent = None if isinstance(exc, KeyboardInterrupt) else self._failure
            if spent is None:
                self.events.emit(Error(stack=self.plan.stack_name,
                                       message=str(exc) or repr(exc), fatal=True))
            self.close(ending(spent or exc))
            if spent is not None:
                raise spent from None  # the start failed because the budget stopped it
            raise
        name = self.plan.stack_name
        self._ready_at = time.monotonic()
        if self._failure is not None:  # spent while handed over: _over_budget saw no pool yet
            self.close(ending(self._failure))
            raise self._failure
        ready = self.membership.ready_count()
        self.events.emit(ClusterReady(stack=name, nodes=ready,
                                      duration=self._ready_at - self._started_at,
                                      hourly_usd=self.usd_per_hour(), adopted=self.adopted))
        log.info("pool %s ready%s: %d node(s) in %.2fs (%s)", name,
                 " (adopted warm)" if self.adopted else "", ready,
                 self._ready_at - self._started_at,
                 ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        assert self.pool is not None
        return self.pool

    def _announce(self) -> None:
        plan, offer = self.plan, self.plan.choice.offer
        accelerator = plan.spec.accelerator
        self.events.emit(ClusterRequested(
            stack=plan.stack_name, provider=plan.provider, nodes=plan.bounds.desired,
            accelerator=accelerator.name if accelerator else None,
            instance_type=offer.instance_type, region=offer.region,
            market=None if plan.provider == "local" else plan.choice.market,
            hourly_usd=self.usd_per_hour(),
            estimated=plan.provider != "local" and plan.choice.estimated))

    def _provision(self) -> None:
        """A cold start: a new stack, one ``up``, every node bootstrapped."""
        plan, name, options = self.plan, self.plan.stack_name, self.plan.options
        self._announce()
        if options.gc_on_start:
            # Other stacks only: it runs beside this pool's provisioning, not before it.
            threading.Thread(target=_collect_garbage, name="skyward-gc", daemon=True).start()
        with self._phase("create"):
            tags = stack_tags(plan.spec, plan.bounds.desired, usd_per_hour=self.usd_per_hour(),
                              user_tags=plan.options.tags)
            if plan.reviewed is not None:
                self.stack = reviewed.take(plan.reviewed, tags)
            else:
                self.stack = ClusterStack.create(plan.request, tags)
        self._beat_and_converge()
        log.info("stack %s: bringing up %d node(s)", name, plan.bounds.desired)
        assert self.reconciler is not None
        with self._phase("up"):
            self.reconciler.step()  # in this thread: Ctrl+C during `up` lands here
        # Capacity failover may have moved the pool (zone, region or the next Spec).
        self.plan = self.reconciler.plan
        self.events.emit(ClusterProvisioned(stack=name, nodes=plan.bounds.desired,
                                            duration=self.timings["up"]))

    def _adopt(self, claim: warm.Claim) -> bool:
        """Take over a warm pool from its keeper: reconnect to its nodes' agents, no stack
        update and no bootstrap. False (the pool given back) when that fails."""
        pool, original = claim.pool, self.plan
        self.plan = self.plan.adopting(pool.stack, pool.node_count, pool.on_demand_nodes)
        self.cost.set_rate(self.plan.usd_per_hour(self.plan.request))
        self._teardown.stack = pool.stack
        self.dispatcher.rename(pool.stack)
        self.nodes.stack = pool.stack
        self._announce()
        self.stack = ClusterStack.select(pool.stack, lazy=True)
        self._beat_and_converge()
        assert self.reconciler is not None
        self.reconciler.adopt(pool.outputs, pool.ports)
        with self._phase("nodes"):
            if not self.membership.wait_ready(pool.node_count, self.plan.options.ssh_timeout
                                              or 30.0):
                log.warning("stack %s: warm nodes did not answer (%s); starting cold",
                            pool.stack, self.membership.failures())
                claim.release()
                self._forget_adoption(original)
                return False
        claim.confirm()  # our heartbeats run: the keeper stops
        self.adopted = True
        # The stack's life before this pool's meter started (the keeper's clock is this
        # machine's): what it cost until then, and since when it runs.
        self.cost.add(pool.cost_at(self._up_since, self.cost.rate))
        self._up_from = time.monotonic() - pool.age(time.time())
        self._up_since = pool.up_since or self._up_since
        stack = self.stack
        threading.Thread(target=stack.set_warm, args=(None,), name="skyward-unwarm",
                         daemon=True).start()
        return True

    def _forget_adoption(self, original: PoolPlan) -> None:
        """Back to a cold start after a failed adoption: the warm nodes are the keeper's again."""
        if self.nodes.heartbeat is not None:
            self.nodes.heartbeat.stop()
        if self._lease is not None:
            self._lease.stop()  # the stack is the keeper's again
            self._lease = None
        if self.reconciler is not None:
            self.reconciler.stop(0)
        for node in self.membership.nodes():
            node.detach()
        self.plan, self.stack, self.reconciler = original, None, None
        self._teardown.stack = original.stack_name
        self.dispatcher.rename(original.stack_name)
        self.membership = Membership(original.bounds, self.dispatcher.serve, self._changed)
        self.nodes = NodeEvents(original.stack_name, self.membership, self.dispatcher,
                                self.events, self.nodes.on_output)

    def _beat_and_converge(self) -> None:
        plan, options = self.plan, self.plan.options
        assert self.stack is not None
        if plan.spec.ttl:
            self.nodes.heartbeat = Heartbeat(plan.spec.ttl, self.nodes.silent, plan.stack_name,
                                             self._budget or NoBudget())
            self._teardown.add("heartbeat", self.nodes.heartbeat.stop)
            self._lease = LeaseRenewer(plan.stack_name, plan.spec.ttl,
                                       self.stack.renew_lease).start()
            self._teardown.add("lease", self._lease.stop)
        launch = self.nodes.launch(options.ssh_timeout or 30.0, options.ssh_retry_interval or 1.0,
                                   plan.node_plugins)
        self.reconciler = Reconciler(plan, self.stack, self.membership, self.dispatcher, launch,
                                     self.events, self.nodes.gone)
        self.reconciler.on_applied = self._applied
        self._teardown.add("stack updates", self._reconciler_stop)

    def _run(self) -> None:
        """From the first nodes on: the pool, its waits, and what watches it."""
        plan, options = self.plan, self.plan.options
        assert self.reconciler is not None and self.reconciler.outputs is not None
        # The stack's latest outputs: a replaced head has a new address, so a new etcd CA.
        reconciler, first = self.reconciler, self.reconciler.outputs
        collections = ClientCollections(lambda: reconciler.outputs or first, plan.run_id,
                                        self._head, options.provision_timeout or 600.0,
                                        plan.stack_name, self.events.emit)
        self.pool = Pool(plan, self.dispatcher, self.membership, collections, self.events,
                         self.resize)
        self._teardown.add("nodes", self._close_nodes)
        self._teardown.add("collections", collections.close)
        self._teardown.add("queued calls", lambda: self.dispatcher.close("the pool closed",
                                                                         self._failure))
        with self._phase("nodes"):
            self._wait_ready()
        self.reconciler.start()
        if options.health_checker is not None:
            health = HealthMonitor(options.health_checker, self.membership.in_service,
                                   options.worker.concurrency, self.nodes.unhealthy)
            self._teardown.add("health checks", health.stop)
        if plan.bounds.elastic:
            autoscaler = Autoscaler(self.dispatcher, self.membership, options)
            self._teardown.add("autoscaler", autoscaler.stop)
        client_plugins = contextlib.ExitStack()
        self._teardown.add("plugins", client_plugins.close)
        client_plugins.enter_context(plugins.around_client(
            plan.spec.plugins, self.pool, Cluster(plan.stack_name, plan.spec,
                                                  plan.bounds.desired)))

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
        """Tear the pool down; the stack's destroy always runs (or, with ``keep_warm``, the
        handover to a keeper), the first error is raised after it. Safe to call twice: a
        second call returns once the first is done."""
        if self._closed.is_set():
            self._torn_down.wait()  # closing on another thread (the budget's): wait for it
            return
        self._closed.set()
        try:
            self._kept_warm = self._keep_warm(how)
            self.membership.stop(how)
            self._how = how
            self._teardown.run()
        finally:
            self._torn_down.set()

    def _over_budget(self, error: BudgetExceededError) -> None:
        """The budget is spent: no node joins any more, a start under way fails with
        ``error``; a pool handed over is closed and destroyed now, on a thread the interpreter
        waits for (the user's code may be busy elsewhere), its pending calls failing with
        ``error``."""
        self._failure = error
        self.membership.stop(str(error))
        if self._ready_at is not None:
            threading.Thread(target=self.close, args=(ending(error),),
                             name=f"{self.plan.stack_name}-budget-close").start()

    def _keep_warm(self, how: str) -> bool:
        """Whether to leave the nodes for the next equal pool: asked for, a clean close (not a
        Ctrl+C: that means stop), and every node in service."""
        return (self.plan.options.keep_warm > 0 and self.stack is not None
                and self.reconciler is not None and self.reconciler.outputs is not None
                and not self.membership.stopped and "Ctrl+C" not in how
                and self.membership.ready_count() == self.membership.declared > 0
                and self.membership.declared == self.membership.desired)

    def _reconciler_stop(self) -> None:
        if self.reconciler is not None:
            self.reconciler.stop(self.plan.options.shutdown_timeout)

    def _close_nodes(self) -> None:
        """Close every node's connections (and unmount volumes, unless kept warm); their
        unfinished calls fail."""
        error = self._failure or NodeConnectionError(f"pool {self.plan.stack_name} closed")
        for node in self.membership.nodes():
            fail(node.detach() if self._kept_warm else node.close(), error)

    def _destroy_or_keep(self) -> None:
        if self._kept_warm:
            self._hand_to_keeper()
        else:
            self._destroy()

    def _hand_to_keeper(self) -> None:
        """Start the keeper and wait until it keeps the nodes; if it does not, destroy."""
        assert self.reconciler is not None and self.reconciler.outputs is not None
        plan, request = self.plan, self.reconciler.request
        ports = {node.index: node.agent_port for node in self.membership.nodes()}
        keeper = start_keeper(
            warm.WarmPool(plan.stack_name, self.reconciler.outputs, ports, request.node_count,
                          tuple(sorted(request.on_demand_nodes)), up_since=self._up_since,
                          warm_since=time.time(), spent_usd=self.cost.total()),
            plan.warm_key, plan.options.keep_warm, plan.spec.ttl,
            plan.options.ssh_timeout or 30.0)
        if not warm.wait_listed(plan.warm_key, plan.stack_name, keeper,
                                plan.options.ssh_timeout or 30.0):
            log.error("stack %s: its keeper did not start; destroying it instead",
                      plan.stack_name)
            self._destroy()
            return
        log.info("stack %s: kept warm for %gs by keeper %d (skyward-iac ls shows it)",
                 plan.stack_name, plan.options.keep_warm, keeper.pid)
        self.stack = None

    def _destroy(self) -> None:
        stack = self.stack
        if stack is None:
            return
        name, how = self.plan.stack_name, self._how
        log.info("stack %s: destroying (%s)", name, how)
        try:
            with self._phase("destroy"):
                _destroy(stack, f"skyward: {how}", self.plan.options.shutdown_timeout,
                         EngineEventTranslator(name, "destroy", self.events.emit))
        except KeyboardInterrupt as interrupt:
            # A Ctrl+C lets a destroy run to its end (engine_command): when it deleted
            # everything the pool is gone all the same, and says so before the Ctrl+C goes on.
            # Its own exit status says so; no other engine command (a further Ctrl+C would
            # interrupt that one).
            ended = completed(interrupt)
            if (ended.code == 0) if ended is not None else _emptied(stack):
                self._destroyed(name)
            raise
        self._destroyed(name)

    def _destroyed(self, name: str) -> None:
        uptime = time.monotonic() - self._up_from
        log.info("stack %s: destroyed in %.1fs", name, self.timings["destroy"])
        self.events.emit(ClusterDestroyed(stack=name, duration=self.timings["destroy"],
                                          uptime=uptime, cost_usd=self.cost.total(),
                                          adopted=self.adopted))
        self.stack = None

    # ---- small things --------------------------------------------------------------------------

    def usd_per_hour(self) -> float:
        request = self.reconciler.request if self.reconciler is not None else self.plan.request
        return self.plan.usd_per_hour(request)

    def _applied(self, request: ClusterRequest) -> None:
        """A stack update put ``request`` in force: the cost meter runs at its rate, and the
        stack's ``nodes``/``usd_per_hour`` tags say what it declares now."""
        rate = self.plan.usd_per_hour(request)
        self.cost.set_rate(rate)
        tagged = (request.node_count, f"{rate:.4f}")
        if self.stack is None or tagged == self._tagged:
            return
        try:
            self.stack.update_tags({"nodes": str(tagged[0]), "usd_per_hour": tagged[1]})
            self._tagged = tagged
        except Exception as exc:  # noqa: BLE001 - a stale tag must not stop the pool
            log.warning("stack %s: updating its tags failed: %s", self.plan.stack_name, exc)

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
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


def _emptied(stack: ClusterStack) -> bool:
    """Whether ``stack`` holds no resource any more (False when that cannot be read)."""
    try:
        return stack.resource_count() == 0
    except Exception:  # noqa: BLE001 - unknown: the caller reports nothing
        return False


def _collect_garbage() -> None:
    try:
        for action in gc.collect(retention_days=None, this_host_only=True):
            log.info("gc: %s %s (%s)", action.action, action.stack, action.reason)
    except Exception as exc:  # noqa: BLE001 - a failed cleanup must not block new work
        log.warning("gc before start failed: %s", exc)
