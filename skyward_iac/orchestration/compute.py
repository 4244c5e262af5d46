"""``sky.Compute``, ``sky.Session``, ``@sky.pool`` and ``sky.MultiPool``: pools as stacks.

The path reads straight through: Spec -> stack program -> ``up`` -> node addresses -> SSH ->
bootstrap -> agent -> tasks; and on the way out: agents closed -> ``destroy``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import Token
from dataclasses import replace
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from skyward_iac import config_file
from skyward_iac.api.errors import ConfigError, StackBusyError
from skyward_iac.api.function import Dispatcher, active_pool
from skyward_iac.api.runtime import InstanceInfo, PeerInfo
from skyward_iac.api.spec import Options, SelectionStrategy, Spec, validated
from skyward_iac.api.volumes import volume_keys
from skyward_iac.collections import context as collections_context
from skyward_iac.infra import engine, gc, offers
from skyward_iac.infra.cloud_credentials import require_credentials
from skyward_iac.infra.programs import ClusterRequest, program_for
from skyward_iac.infra.spot_fallback import up_with_spot_fallback
from skyward_iac.infra.stack import (
    ClusterOutputs,
    ClusterStack,
    NodeAddress,
    new_stack_name,
    stack_tags,
)
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.console import acquire_console
from skyward_iac.observability.engine_events import EngineEventTranslator
from skyward_iac.observability.events import (
    ClusterDestroyed,
    ClusterProvisioned,
    ClusterReady,
    ClusterRequested,
    Error,
    Event,
    InstancePreempted,
    InstanceReplaced,
)
from skyward_iac.observability.logging import configure_logging
from skyward_iac.orchestration.autoscaler import PoolLoad, desired_nodes
from skyward_iac.orchestration.collections import ClientCollections, head_etcd_plan, node_config
from skyward_iac.orchestration.health import HealthMonitor
from skyward_iac.orchestration.heartbeat import Heartbeat
from skyward_iac.orchestration.node import Node, plan_for
from skyward_iac.orchestration.pool import Pool, print_output
from skyward_iac.orchestration.preview import require_plugin
from skyward_iac.plugins import _client as plugins
from skyward_iac.plugins._plugin import Cluster
from skyward_iac.remote.bootstrap import BootstrapPlan
from skyward_iac.remote.includes import IncludesArchive, build_archive
from skyward_iac.remote.volumes import mount_plan

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("skyward")
#: The head's coordination port (etcd's client port on the head node).
HEAD_PORT = 2379


def _resolve_spec(specs: tuple[Spec, ...], name: str | None, fields: dict[str, Any],
                  selection: SelectionStrategy = "cheapest") -> offers.Choice:
    """The spec to provision and its offer; several Specs are a fallback list.

    ``selection`` picks among several (``Options.selection``); a Local spec costs 0 and always
    has its offer, so under ``"cheapest"`` it wins over any cloud.
    """
    if name is not None:
        if specs or fields:
            raise ConfigError("name= loads a whole pool from skyward.toml; it cannot be combined "
                              f"with Specs or spec fields (got {len(specs)} Spec(s), "
                              f"{sorted(fields)})")
        specs = (config_file.load_pool(name),)
    if specs and fields:
        raise ConfigError(
            "sky.Compute takes either Spec objects or spec fields as keyword arguments, not both "
            f"(got {len(specs)} Spec(s) and {sorted(fields)})"
        )
    if not specs:
        specs = (validated(Spec, **fields),)
    if not all(isinstance(s, Spec) for s in specs):
        raise ConfigError("positional arguments of sky.Compute must be sky.Spec objects")
    return offers.select(specs, selection)


def ending(exc: BaseException | None) -> str:
    """How a run ended, as recorded in the stack's history."""
    if exc is None:
        return "pool closed"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl+C)"
    return f"closed after {type(exc).__name__}"


def instance_infos(outputs: ClusterOutputs, spec: Spec, job_id: str) -> list[InstanceInfo]:
    """What each node's tasks see through ``sky.instance_info()``."""
    peers = [PeerInfo(node=n.index, private_ip=n.private_address, public_ip=n.public_address)
             for n in outputs.nodes]
    per_node = spec.accelerator.count if spec.accelerator else 0
    return [
        InstanceInfo(
            node=node.index, total_nodes=len(outputs.nodes), head_addr=peers[0].private_ip,
            head_port=HEAD_PORT, job_id=job_id, peers=peers, accelerators=per_node,
            total_accelerators=per_node * len(outputs.nodes),
            workers_per_node=plugins.workers_per_node(spec.plugins),
        )
        for node in outputs.nodes
    ]


class Compute:
    """Provision a pool as one Pulumi stack for the length of a ``with`` block.

    ``with sky.Compute(provider=sky.Local(), nodes=2) as pool:`` validates everything first,
    then creates the stack, brings it up, bootstraps every node and yields the ``Pool``. Leaving
    the block, by any path, closes the connections and destroys the stack.
    """

    def __init__(self, *specs: Spec, name: str | None = None, options: Options | None = None,
                 on_output: Callable[[int, str, str], Any] = print_output,
                 on_event: Callable[[Event], Any] | None = None, **fields: Any) -> None:
        if options is not None and not isinstance(options, Options):
            raise ConfigError(f"options must be sky.Options(...), got {type(options).__name__}")
        self.options = options or Options()
        #: The chosen spec's offer (instance type, region, market) and its price.
        self.choice = _resolve_spec(specs, name, fields, self.options.selection)
        self.spec = self.choice.spec
        self.on_output = on_output
        self.node_count = self.spec.nodes.desired
        self.stack_name = new_stack_name(self.spec)
        # Plugins edit the image and name their bootstrap steps now: a failing hook (named in
        # the PluginError) stops the pool before anything is provisioned.
        self.spec = plugins.transformed_spec(self.spec, self.stack_name, self.node_count)
        self._plugin_steps = plugins.bootstrap_steps(self.spec, self.stack_name, self.node_count)
        plugins.check_workers(self.spec.plugins, self.options.worker)
        # Bootstrap steps reach the event bus (created below) as BootstrapPhase events.
        self._start_node = functools.partial(Node.start,
                                             plugins=plugins.node_plugins(self.spec.plugins),
                                             on_event=lambda event: self.events.emit(event),
                                             stack=self.stack_name)
        self._client_plugins = contextlib.ExitStack()
        # Keys given as callables are resolved once, here; the stack keeps them as secrets.
        keys = volume_keys(self.spec.volumes, self.spec.provider.kind)
        self.request = ClusterRequest(self.stack_name, self.spec, self.node_count,
                                      volume_keys=keys,
                                      offer=self.choice.offer,
                                      collections=self.options.collections)
        program_for(self.request)  # an unsupported provider fails here, before provisioning
        engine.find_engine()  # and so does a missing engine
        self.stack: ClusterStack | None = None
        self.pool: Pool | None = None
        #: Seconds spent in each phase: create, up, nodes (SSH + bootstrap + agent), destroy.
        self.timings: dict[str, float] = {}
        self._heartbeat: Heartbeat | None = None
        self._health: HealthMonitor | None = None
        #: Nodes still bootstrapping when the pool became ready (``Nodes.min``), in index order.
        self._late: list[Future[Node]] = []
        self._joined = threading.Event()
        self._ready_at: float | None = None
        #: Every event of this pool; ``on_event`` and ``pool.on(...)`` subscribe to it.
        self.events = EventBus()
        if on_event is not None:
            self.events.subscribe(on_event)
        self._replacing = threading.Lock()
        self._release_console: Callable[[], None] | None = None
        self._stopping = threading.Event()
        self._context: Token[Dispatcher | None] | None = None

    def provision(self) -> Pool:
        """Create and bring up the stack and its nodes; on any failure destroy it again."""
        started = time.monotonic()
        # A cloud's provider plugin and credentials are checked before any stack exists.
        require_plugin(self.spec.provider.kind)
        require_credentials(self.spec.provider.kind)
        configure_logging(self.options.logging)
        self._release_console = acquire_console(self.options.console, self.events)
        accelerator = self.spec.accelerator
        self.events.emit(ClusterRequested(
            stack=self.stack_name, provider=self.spec.provider.kind, nodes=self.node_count,
            accelerator=accelerator.name if accelerator else None,
            instance_type=self.choice.offer.instance_type,
            region=self.choice.offer.region,
            market=None if self.spec.provider.kind == "local" else self.choice.market,
            hourly_usd=self._usd_per_hour(),
        ))
        if self.options.gc_on_start:
            # Other stacks only: it runs beside this pool's provisioning, not before it.
            threading.Thread(target=self._collect_garbage, name="skyward-gc", daemon=True).start()
        try:
            with self._phase("create"):
                tags = stack_tags(self.spec, self.node_count, usd_per_hour=self._usd_per_hour())
                self.stack = ClusterStack.create(self.request, tags)
            log.info("stack %s: bringing up %d node(s)", self.stack_name, self.node_count)
            with self._phase("up"):
                # Nodes refused for spot capacity are retried on demand (spot-if-available).
                outputs, self.request = up_with_spot_fallback(
                    self.stack, self.request,
                    EngineEventTranslator(self.stack_name, "up", self.events.emit))
            self.events.emit(ClusterProvisioned(stack=self.stack_name, nodes=self.node_count,
                                                duration=self.timings["up"]))
            with self._phase("nodes"):
                nodes = self._start_nodes(outputs)
                self.pool = Pool(self.stack_name, nodes, self.options,
                                 ClientCollections(outputs, self.stack_name, nodes[0].connection),
                                 self.events)
                self.pool.on_node_lost = self._node_lost
                self.pool.resizer = self.resize
                if self.spec.ttl:
                    self._heartbeat = Heartbeat(nodes, self.spec.ttl)
                if self.options.health_checker is not None:
                    self._health = HealthMonitor(
                        self.options.health_checker, nodes, self.options.worker.concurrency,
                        skip=self.pool.lost.__contains__, on_unhealthy=self._unhealthy)
                if self._elastic:
                    threading.Thread(target=self._autoscale, name="skyward-autoscaler",
                                     daemon=True).start()
            self._client_plugins.enter_context(plugins.around_client(
                self.spec.plugins, self.pool, Cluster(self.stack_name, self.spec, self.node_count)))
        except BaseException as exc:
            self.events.emit(Error(stack=self.stack_name, message=str(exc) or repr(exc),
                                   fatal=True))
            self.teardown(ending(exc))
            raise
        self._ready_at = time.monotonic()
        if self._late:
            threading.Thread(target=self._join_late, args=(self._late,), name="skyward-join",
                             daemon=True).start()
        else:
            self._joined.set()
        ready = len(self.pool.nodes) if self.pool is not None else self.node_count
        self.events.emit(ClusterReady(stack=self.stack_name, nodes=ready,
                                      duration=self._ready_at - started,
                                      hourly_usd=self._usd_per_hour()))
        log.info("pool %s ready in %.1fs (%s)", self.stack_name, time.monotonic() - started,
                 ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        return self.pool

    def _start_nodes(self, outputs: ClusterOutputs) -> list[Node]:
        infos = instance_infos(outputs, self.spec, self.stack_name)
        collections = node_config(outputs, self.stack_name)
        threads = ThreadPoolExecutor(max_workers=len(outputs.nodes))
        futures = [
            threads.submit(
                self._start_node, address, outputs,
                self._plan(address, outputs),
                self.options.ssh_timeout, infos[address.index], self.on_output, collections,
                self._lost,
            )
            for address in outputs.nodes
        ]
        threads.shutdown(wait=False)
        # Partial readiness: the pool is ready once its first ``min`` nodes are (by index: the
        # head first, and a pool's nodes are contiguous); the others join as they come.
        ready = min(self.spec.nodes.min or len(futures), len(futures))
        nodes, errors = _results(futures[:ready])
        if errors:
            nodes += _results(futures[ready:])[0]  # none left running unseen
            for node in nodes:
                node.close()
            raise errors[0]
        late = futures[ready:]
        while late and late[0].done() and late[0].exception() is None:
            nodes.append(late.pop(0).result())
        self._late = late
        return nodes

    def _join_late(self, late: list[Future[Node]]) -> None:
        """Put the nodes still bootstrapping at readiness in service as they come, in index
        order; one that fails is reported and ends the joining (the pool keeps its nodes).
        No resize runs before it is done (``_joined``): the stack still declares them all."""
        try:
            for position, future in enumerate(late):
                try:
                    node = future.result()
                except Exception as exc:  # noqa: BLE001 - reported; the pool works without it
                    log.error("stack %s: a late node failed to start: %s", self.stack_name, exc)
                    self.events.emit(Error(stack=self.stack_name,
                                           message=f"a late node failed to start: {exc}"))
                    for later in late[position + 1:]:
                        later.add_done_callback(_close_started)
                    return
                with self._replacing:
                    pool = self.pool
                    if pool is None or self._stopping.is_set():
                        node.close()
                        continue
                    pool.add(node)
                log.info("stack %s: node %d joined (%d ready)", self.stack_name,
                         node.address.index, pool.current_nodes())
        finally:
            self._joined.set()

    def _plan(self, address: NodeAddress, outputs: ClusterOutputs) -> BootstrapPlan:
        """How to bootstrap ``address``: etcd on the head, this pool's volumes everywhere."""
        region = None if self.spec.provider.kind == "local" else self.choice.offer.region
        volumes = mount_plan(self.spec.volumes, self.spec.provider.kind, outputs.volume_keys,
                             region=region)
        plan = plan_for(address, self.spec, self.options, head_etcd_plan(outputs), volumes,
                        self._includes)
        return replace(plan, steps=plan.steps + self._plugin_steps)

    @functools.cached_property
    def _includes(self) -> IncludesArchive | None:
        """The Image's includes, packed once: every node (late, replaced or added by a resize)
        gets the code as it was when the pool started."""
        image = self.spec.image
        return build_archive(image.includes, image.excludes) if image.includes else None

    def _lost(self, index: int) -> None:
        if self.pool is not None:
            self.pool.node_lost(index)

    def _unhealthy(self, index: int, reason: str) -> None:
        if self.pool is not None:
            self.pool.node_lost(index, reason, alive=True)

    def _node_lost(self, index: int, reason: str, alive: bool = False) -> None:
        log.warning("stack %s: node %d out of service (%s); replacing it", self.stack_name,
                    index, reason)
        self.events.emit(InstancePreempted(stack=self.stack_name, node=index, reason=reason))
        threading.Thread(target=self._replace, args=(index, alive), name=f"replace-node-{index}",
                         daemon=True).start()

    def _replace(self, index: int, alive: bool = False) -> None:
        """Bring node ``index`` back through a stack update (refresh notices it is gone, the
        update creates it again; an ``alive`` one, unhealthy or about to be preempted, is
        recreated explicitly), bootstrap it, and tell every peer the new addresses."""
        with self._replacing:  # one stack update at a time
            stack, pool = self.stack, self.pool
            if stack is None or pool is None:
                return
            try:
                outputs, self.request = up_with_spot_fallback(
                    stack, self.request, refresh=True,
                    message=f"skyward: replace node {index}",
                    replace_nodes=(index,) if alive else ())
                infos = instance_infos(outputs, self.spec, self.stack_name)
                collections = node_config(outputs, self.stack_name)
                address = outputs.nodes[index]
                node = self._start_node(address, outputs, self._plan(address, outputs),
                                  self.options.ssh_timeout, infos[index], self.on_output,
                                  collections, self._lost)
            except Exception as exc:  # noqa: BLE001 - reported; the pool keeps the other nodes
                log.error("stack %s: replacing node %d failed: %s", self.stack_name, index, exc)
                self.events.emit(Error(stack=self.stack_name, node=index,
                                       message=f"replacing node {index} failed: {exc}"))
                return
            if self.pool is not pool:  # the pool closed meanwhile
                node.close()
                return
            old = pool.nodes[index].address
            pool.replace(index, node)
            for other in pool.nodes:
                if other is not node and other.address.index not in pool.lost:
                    other.configure(infos[other.address.index], collections)
        log.info("stack %s: node %d replaced (%s -> %s)", self.stack_name, index,
                 old.public_address, address.public_address)
        self.events.emit(InstanceReplaced(stack=self.stack_name, node=index,
                                          old_instance_id=old.public_address,
                                          instance_id=address.public_address))

    @property
    def _bounds(self) -> tuple[int, int]:
        nodes = self.spec.nodes
        return nodes.min or nodes.desired, max(nodes.max or nodes.desired, nodes.desired)

    @property
    def _elastic(self) -> bool:
        floor, ceiling = self._bounds
        return ceiling > floor

    def resize(self, target: int) -> None:
        """Grow or shrink the pool to ``target`` nodes (clamped to the spec's min/max) through
        a stack update: new nodes are bootstrapped and join; removed ones drain first."""
        self._joined.wait()  # nodes still joining (partial readiness) are part of the stack
        with self._replacing:
            stack, pool = self.stack, self.pool
            if stack is None or pool is None:
                return
            floor, ceiling = self._bounds
            current, target = len(pool.nodes), max(floor, min(ceiling, target))
            if target == current:
                return
            for index in range(current - 1, target - 1, -1):
                pool.retire(index)
            self.request = replace(self.request, node_count=target)
            stack.set_request(self.request)
            outputs, self.request = up_with_spot_fallback(
                stack, self.request, message=f"skyward: resize {current} -> {target} nodes")
            infos = instance_infos(outputs, self.spec, self.stack_name)
            collections = node_config(outputs, self.stack_name)
            with ThreadPoolExecutor(max_workers=max(1, target - current)) as threads:
                started = [
                    threads.submit(self._start_node, address, outputs,
                                   self._plan(address, outputs),
                                   self.options.ssh_timeout, infos[address.index],
                                   self.on_output, collections, self._lost)
                    for address in outputs.nodes[current:]
                ]
                for future in started:
                    pool.add(future.result())
            for node in pool.nodes:
                try:
                    node.configure(infos[node.address.index], collections)
                except OSError as exc:  # its reader reports the node lost; it gets replaced
                    log.warning("node %d missed the new peer list: %s", node.address.index, exc)
        log.info("stack %s: resized from %d to %d nodes", self.stack_name, current, target)

    def _autoscale(self) -> None:
        floor, ceiling = self._bounds
        last_change, idle_since = time.monotonic(), None
        while not self._stopping.wait(self.options.reconcile_tick_interval):
            pool = self.pool
            if pool is None:
                return
            if not self._joined.is_set():
                continue  # the pool is still forming
            queued, running = pool.load()
            now = time.monotonic()
            idle_since = (idle_since or now) if queued == running == 0 else None
            load = PoolLoad(len(pool.nodes), queued, running, pool.slots_per_node, floor, ceiling)
            target = desired_nodes(load, now=now, last_change=last_change, idle_since=idle_since,
                                   cooldown=self.options.autoscale_cooldown,
                                   idle_timeout=self.options.autoscale_idle_timeout)
            if target != load.nodes:
                try:
                    self.resize(target)
                except Exception as exc:  # noqa: BLE001 - retried at the next tick
                    log.error("stack %s: autoscaling to %d failed: %s", self.stack_name, target, exc,
                              exc_info=True)
                last_change, idle_since = time.monotonic(), None

    def teardown(self, how: str = "pool closed") -> None:
        """Close the pool's connections and destroy the stack (the stack stays on record, its
        history saying ``how`` the run ended)."""
        self._stopping.set()
        # A stack update under way (resize, replacement) finishes before the destroy starts.
        if self._replacing.acquire(timeout=self.options.shutdown_timeout):
            self._replacing.release()
        try:
            self._client_plugins.close()
        except Exception as exc:  # noqa: BLE001 - the pool must still be destroyed
            log.error("stack %s: a plugin's around_client failed on exit: %s", self.stack_name, exc)
        if self._heartbeat is not None:
            self._heartbeat.stop()
            self._heartbeat = None
        if self._health is not None:
            self._health.stop()
            self._health = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        try:
            if self.stack is not None:
                log.info("stack %s: destroying (%s)", self.stack_name, how)
                with self._phase("destroy"):
                    self._destroy(self.stack, how)
                log.info("stack %s: destroyed in %.1fs", self.stack_name,
                         self.timings["destroy"])
                uptime = time.monotonic() - self._ready_at if self._ready_at else 0.0
                self.events.emit(ClusterDestroyed(
                    stack=self.stack_name, duration=self.timings["destroy"], uptime=uptime,
                    cost_usd=self._usd_per_hour() * uptime / 3600))
                self.stack = None
        finally:
            if self._release_console is not None:
                self._release_console()
                self._release_console = None

    def _destroy(self, stack: ClusterStack, how: str) -> None:
        # After Ctrl+C the engine may still be finishing the interrupted update and hold the
        # lock for a moment: wait for it (bounded), and clear a lock whose holder died.
        deadline = time.monotonic() + self.options.shutdown_timeout
        while True:
            try:
                stack.destroy(message=f"skyward: {how}", on_event=EngineEventTranslator(
                    self.stack_name, "destroy", self.events.emit))
                return
            except StackBusyError:
                if time.monotonic() > deadline:
                    raise
                if stack.stale_locks():
                    stack.clear_crash_leftovers()
                time.sleep(0.5)

    def _collect_garbage(self) -> None:
        try:
            for action in gc.collect(retention_days=None, this_host_only=True):
                log.info("gc: %s %s (%s)", action.action, action.stack, action.reason)
        except Exception as exc:  # noqa: BLE001 - a failed cleanup must not block new work
            log.warning("gc before start failed: %s", exc)

    def _usd_per_hour(self) -> float:
        """The estimated USD/hour of the nodes the stack declares now, each at its market's
        price (nodes the spot fallback moved on demand at the on-demand one)."""
        try:
            return offers.hourly_cost(self.choice, self.request.node_count,
                                      self.request.on_demand_nodes)
        except Exception:  # noqa: BLE001 - an estimate only
            return 0.0

    def __enter__(self) -> Pool:
        pool = self.provision()
        self._context = active_pool.set(pool)
        self._collections = collections_context.bind(pool.collections)
        return pool

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._context is not None:
            collections_context.unbind(self._collections)
            active_pool.reset(self._context)
            self._context = None
        self.teardown(ending(exc))

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = time.monotonic() - started


class Session:
    """Several pools with lifetimes of your choosing; every one is destroyed at ``close()``.

    ``with sky.Session() as session: a = session.compute(provider=sky.Local(), nodes=2)``
    """

    def __init__(self) -> None:
        self._computes: list[Compute] = []

    def compute(self, *specs: Spec, options: Options | None = None, **fields: Any) -> Pool:
        """Provision a pool now; it lives until ``release(pool)`` or the session closes."""
        compute = Compute(*specs, options=options, **fields)
        pool = compute.provision()
        self._computes.append(compute)
        return pool

    def release(self, pool: Pool) -> None:
        """Destroy one pool of this session now."""
        for compute in list(self._computes):
            if compute.pool is pool:
                self._computes.remove(compute)
                compute.teardown()
                return
        raise ConfigError(f"{pool!r} does not belong to this session")

    def close(self) -> None:
        """Destroy every pool still alive, concurrently."""
        computes, self._computes = self._computes, []
        _teardown_all(computes)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MultiPool:
    """Provision several ``Compute`` pools concurrently: ``with sky.MultiPool(a, b) as (p, q):``.

    Setup takes as long as the slowest pool, not the sum; all are destroyed on exit, and if one
    fails to come up the others are destroyed before the error is raised.
    """

    def __init__(self, *computes: Compute) -> None:
        if not computes or not all(isinstance(c, Compute) for c in computes):
            raise ConfigError("sky.MultiPool takes one or more sky.Compute(...) objects")
        self.computes = computes

    def __enter__(self) -> tuple[Pool, ...]:
        with ThreadPoolExecutor(max_workers=len(self.computes)) as threads:
            futures = [threads.submit(compute.provision) for compute in self.computes]
            errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            _teardown_all(list(self.computes))
            raise errors[0]  # type: ignore[misc]
        return tuple(f.result() for f in futures)

    def __exit__(self, *exc: object) -> None:
        _teardown_all(list(self.computes))


def _results(futures: list[Future[Node]]) -> tuple[list[Node], list[BaseException]]:
    """Wait for node starts: the nodes that started, and the errors of those that did not."""
    nodes, errors = [], []
    for future in futures:
        try:
            nodes.append(future.result())
        except BaseException as exc:  # noqa: BLE001 - collected, the caller raises the first
            errors.append(exc)
    return nodes, errors


def _close_started(future: Future[Node]) -> None:
    if future.exception() is None:
        future.result().close()


def _teardown_all(computes: list[Compute]) -> None:
    with ThreadPoolExecutor(max_workers=max(1, len(computes))) as threads:
        for future in [threads.submit(c.teardown) for c in computes]:
            future.result()


def pool(*specs: Spec, options: Options | None = None,
         **fields: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorator: each call of the function runs inside its own ``with sky.Compute(...)``,
    so ``>> sky`` inside it reaches that pool. The spec is validated when decorating."""
    Compute(*specs, options=options, **fields)  # fail at decoration time, nothing provisioned

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with Compute(*specs, options=options, **fields):
                return fn(*args, **kwargs)

        return run

    return decorate
