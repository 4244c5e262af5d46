"""``PoolLifecycle``: the thin sequencer of one pool's life.

Cold start or adoption, run, then close or keep warm:

1. **settle** the plan: a warm pool of the same kind claimed from its keeper (``warm.py``)
   makes it that pool's stack, else it is the plan asked for;
2. **build** the pool's parts for it (``parts.PoolParts``: one factory, one identity);
3. **start**: a cold start creates the stack and brings it up (the reconciler's first step,
   in this thread so a Ctrl+C lands here); an adoption reattaches to the warm nodes, and if
   that fails, its parts are discarded whole and a cold start follows;
4. **run**: wait for ``Nodes.min`` nodes, hand over the ``Pool``, watch it;
5. **close**: the parts' ``Teardown`` runs every stop in its declared phase, ending with the
   stack's destroy through the one destroy path (``infra/stacks/destroy.py``) or, with
   ``keep_warm``, the handover of the nodes to a keeper (``keeper.py``), then the console.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from skyward_iac.api.errors import BudgetExceededError
from skyward_iac.infra.engine.provider_plugins import require_plugin
from skyward_iac.infra.identity.cloud_credentials import require_credentials
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks import destroy, gc
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
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.keeper import start_keeper
from skyward_iac.orchestration.notebook import destroy_at_kernel_exit
from skyward_iac.orchestration.parts import PoolParts
from skyward_iac.orchestration.plan import PoolPlan
from skyward_iac.orchestration.pool import Pool
from skyward_iac.orchestration.run_record import placement
from skyward_iac.orchestration.teardown import Phase, Teardown

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
        #: The plan asked for; ``plan`` is the one in force once the parts exist.
        self._asked = plan
        self.events, self.on_output = events, on_output
        #: The pool's parts once settled (an adoption's only once it succeeded).
        self.parts: PoolParts | None = None
        self.stack: ClusterStack | None = None
        self.pool: Pool | None = None
        #: Seconds spent in each phase: create, up, nodes (until ready), destroy.
        self.timings: dict[str, float] = {}
        #: The console and the stack's end, until the parts' teardown takes them in.
        self._teardown = Teardown(PoolIdentity(plan.stack_name, plan.run_id))
        self._started_at = time.monotonic()
        #: Since when the stack runs: this pool's start, or a warm pool's first (adopted).
        self._up_from, self._up_since = self._started_at, time.time()
        self._ready_at: float | None = None
        self._closed, self._torn_down = threading.Event(), threading.Event()
        self._how = "pool closed"
        #: Whether this pool was adopted warm, and whether it is left warm at close.
        self.adopted = False
        self._kept_warm = False

    @property
    def plan(self) -> PoolPlan:
        """The plan in force: the settled one (a warm pool's stack), moved by any failover."""
        return self.parts.plan if self.parts is not None else self._asked

    @property
    def request(self) -> ClusterRequest:
        """The ``ClusterRequest`` in force (with any fallback it took)."""
        return self.parts.reconciler.request if self.parts is not None else self._asked.request

    @property
    def _failure(self) -> BudgetExceededError | None:
        return self.parts.failure if self.parts is not None else None

    def usd_per_hour(self) -> float:
        return self.parts.usd_per_hour() if self.parts is not None else \
            self._asked.usd_per_hour(self._asked.request)

    # ---- bringing it up ----------------------------------------------------------------------

    def start(self) -> Pool:
        """Adopt a warm pool of the same kind, or create and bring up the stack; wait for
        ``Nodes.min`` nodes; return the pool. On any failure (Ctrl+C included) tear everything
        down again and raise."""
        plan = self._asked
        # A cloud's provider plugin and credentials are checked before any stack exists.
        require_plugin(plan.provider)
        require_credentials(plan.provider)
        configure_logging(plan.options.logging)
        # In a Jupyter kernel, a reaper destroys the kernel's stacks when it ends (however).
        destroy_at_kernel_exit()
        # A Ctrl+C that ends the script ends the process by SIGINT, whatever runs at exit.
        interrupts.install()
        self._teardown.add(Phase.CONSOLE, "console",
                           acquire_console(plan.options.console, self.events))
        self._teardown.add(Phase.STACK, "destroy", self._destroy_or_keep)
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
        self._ready_at = time.monotonic()
        if self._failure is not None:  # spent while handed over: _over_budget saw no pool yet
            self.close(ending(self._failure))
            raise self._failure
        assert self.parts is not None and self.pool is not None
        name, ready = self.parts.identity.stack, self.parts.membership.ready_count()
        took = self._ready_at - self._started_at
        self.events.emit(ClusterReady(stack=name, nodes=ready, duration=took,
                                      hourly_usd=self.usd_per_hour(), adopted=self.adopted))
        log.info("pool %s ready%s: %d node(s) in %.2fs (%s)", name,
                 " (adopted warm)" if self.adopted else "", ready, took,
                 ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        return self.pool

    def _announce(self, plan: PoolPlan) -> None:
        offer, accelerator = plan.choice.offer, plan.spec.accelerator
        local = plan.spec.provider.on_this_machine  # no market, no estimated price
        self.events.emit(ClusterRequested(
            stack=plan.stack_name, provider=plan.provider, nodes=plan.bounds.desired,
            accelerator=accelerator.name if accelerator else None,
            instance_type=offer.instance_type, region=offer.region,
            market=None if local else plan.choice.market,
            hourly_usd=plan.usd_per_hour(plan.request),
            estimated=not local and plan.choice.estimated))

    def _settle(self, parts: PoolParts, stack: ClusterStack) -> None:
        """``parts`` are the pool's from now on: their teardown ends it (console and stack
        included)."""
        parts.teardown.take(self._teardown)
        self.parts, self.stack, self._teardown = parts, stack, parts.teardown

    def _provision(self) -> None:
        """A cold start: a new stack, one ``up``, every node bootstrapped."""
        plan = self._asked
        self._announce(plan)
        if plan.options.gc_on_start:
            # Other stacks only: it runs beside this pool's provisioning, not before it.
            threading.Thread(target=_collect_garbage, name="skyward-gc", daemon=True).start()
        with self._phase("create"):
            tags = stack_tags(plan.spec, plan.bounds.desired,
                              usd_per_hour=plan.usd_per_hour(plan.request),
                              user_tags=plan.options.tags,
                              placement=placement(plan, plan.request))
            if plan.reviewed is not None:
                self.stack = reviewed.take(plan.reviewed, tags)
            else:
                self.stack = ClusterStack.create(plan.request, tags)
        parts = PoolParts(plan, self.stack, self.events, self.on_output, self._over_budget)
        self._settle(parts, self.stack)
        log.info("stack %s: bringing up %d node(s)", plan.stack_name, plan.bounds.desired)
        with self._phase("up"):
            parts.reconciler.step()  # in this thread: Ctrl+C during `up` lands here
        self.events.emit(ClusterProvisioned(stack=plan.stack_name, nodes=plan.bounds.desired,
                                            duration=self.timings["up"]))

    def _adopt(self, claim: warm.Claim) -> bool:
        """Take over a warm pool from its keeper: reconnect to its nodes' agents, no stack
        update and no bootstrap. False (the pool given back, the parts built for it discarded)
        when that fails."""
        pool = claim.pool
        plan = self._asked.adopting(pool.stack, pool.node_count, pool.on_demand_nodes)
        stack = ClusterStack.select(pool.stack, lazy=True)
        parts: PoolParts | None = None
        ready = False
        try:
            self._announce(plan)
            parts = PoolParts(plan, stack, self.events, self.on_output, self._over_budget)
            parts.reconciler.adopt(pool.outputs, pool.ports)
            with self._phase("nodes"):
                ready = parts.membership.wait_ready(pool.node_count,
                                                    plan.options.ssh_timeout)
            if not ready:
                log.warning("stack %s: warm nodes did not answer (%s); starting cold",
                            pool.stack, parts.membership.failures())
        finally:
            if not ready:  # failed, or interrupted: the keeper keeps the nodes again
                claim.release()
                if parts is not None:
                    parts.discard("the adoption failed")
        if not ready or parts is None:
            return False
        claim.confirm()  # our heartbeats run: the keeper stops
        self.adopted = True
        # The stack's life before this pool's meter started (the keeper's clock is this
        # machine's): what it cost until then, and since when it runs.
        parts.cost.add(pool.cost_at(self._up_since, parts.cost.rate))
        self._up_from = time.monotonic() - pool.age(time.time())
        parts.cost.align(pool.age(time.time()))  # its segments continue the stack's record
        self._up_since = pool.up_since or self._up_since
        self._settle(parts, stack)
        threading.Thread(target=stack.set_warm, args=(None,), name="skyward-unwarm",
                         daemon=True).start()
        return True

    def _run(self) -> None:
        """From the first nodes on: the pool, its wait for ``Nodes.min``, what watches it."""
        parts = self.parts
        assert parts is not None
        plan, options = parts.plan, parts.plan.options
        self.pool = parts.serve()
        timeout = options.provision_timeout + (options.bootstrap_timeout or 0) \
            + plan.spec.image.bootstrap_timeout
        with self._phase("nodes"):
            parts.wait_ready(plan.bounds.ready_at, timeout)
        parts.watch()

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
            parts = self.parts
            self._kept_warm = (parts is not None and self._asked.options.keep_warm > 0
                               and "Ctrl+C" not in how and parts.can_keep_warm())
            if parts is not None:
                parts.keep_nodes = self._kept_warm
                parts.membership.stop(how)
            self._how = how
            self._teardown.run()
        finally:
            self._torn_down.set()

    def _over_budget(self, error: BudgetExceededError) -> None:
        """The budget is spent (the parts stopped the pool's changes and fail its calls with
        ``error``): a pool handed over is closed and destroyed now, on a thread the
        interpreter waits for (the user's code may be busy elsewhere)."""
        if self._ready_at is not None:
            threading.Thread(target=self.close, args=(ending(error),),
                             name=f"{self.plan.stack_name}-budget-close").start()

    def _destroy_or_keep(self) -> None:
        if self._kept_warm:
            self._hand_to_keeper()
        else:
            self._destroy()

    def _hand_to_keeper(self) -> None:
        """Start the keeper and wait until it keeps the nodes; if it does not, destroy."""
        parts = self.parts
        assert parts is not None and parts.reconciler.outputs is not None
        plan, request, name = parts.plan, parts.reconciler.request, parts.identity.stack
        ports = {node.index: node.agent_port for node in parts.membership.nodes()}
        wait = plan.options.ssh_timeout
        keeper = start_keeper(
            warm.WarmPool(name, parts.reconciler.outputs, ports, request.node_count,
                          tuple(sorted(request.on_demand_nodes)), up_since=self._up_since,
                          warm_since=time.time(), spent_usd=parts.cost.total()),
            plan.warm_key, plan.options.keep_warm, plan.spec.ttl, wait)
        if not warm.wait_listed(plan.warm_key, name, keeper, wait):
            log.error("stack %s: its keeper did not start; destroying it instead", name)
            self._destroy()
            return
        log.info("stack %s: kept warm for %gs by keeper %d (skyward-iac ls shows it)",
                 name, plan.options.keep_warm, keeper.pid)
        self.stack = None

    def _destroy(self) -> None:
        """Destroy the stack through the one destroy path, as the process that holds it."""
        stack = self.stack
        if stack is None:
            return
        name, how = stack.name, self._how
        if isinstance(stack, reviewed.ReviewedStack) and not stack.owned():
            log.warning("stack %s: not destroyed by this pool, which did not apply its plan "
                        "(first update: %s)", name, stack.applied_by())
            return
        log.info("stack %s: destroying (%s)", name, how)
        who = destroy.Destroyer(destroy.POOL, how, holds=True,
                                patience=self._asked.options.shutdown_timeout)
        try:
            with self._phase("destroy"):
                outcome = destroy.destroy(stack, who, on_event=EngineEventTranslator(
                    name, "destroy", self.events.emit))
        except KeyboardInterrupt as interrupt:
            # A Ctrl+C lets a destroy run to its end (engine_command): when it deleted
            # everything the pool is gone all the same, and says so before the Ctrl+C goes on.
            if destroy.finished_despite(interrupt, stack):
                self._destroyed(name)
            raise
        if outcome.error is not None:
            raise outcome.error  # recorded as a failed destroy; gc collects the stack later
        self._destroyed(name)

    def _destroyed(self, name: str) -> None:
        uptime = time.monotonic() - self._up_from
        cost = self.parts.cost.total() if self.parts is not None else 0.0
        log.info("stack %s: destroyed in %.1fs", name, self.timings["destroy"])
        self.events.emit(ClusterDestroyed(stack=name, duration=self.timings["destroy"],
                                          uptime=uptime, cost_usd=cost, adopted=self.adopted))
        self.stack = None

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - started


def _collect_garbage() -> None:
    try:
        for action in gc.collect(retention_days=None, this_host_only=True):
            log.info("gc: %s %s (%s)", action.action, action.stack, action.reason)
    except Exception as exc:  # noqa: BLE001 - a failed cleanup must not block new work
        log.warning("gc before start failed: %s", exc)
