"""``PoolPlan``: everything decided about a pool before its stack exists.

Spec -> offer -> stack name -> ``ClusterRequest`` -> each node's ``BootstrapPlan`` and
``InstanceInfo``. Validation happens here, so bad input fails before anything is provisioned;
nothing here creates a stack, opens a connection or starts a thread. ``Compute`` acts on a
plan; ``preview`` previews one.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from skyward_iac import config_file
from skyward_iac.api.errors import ConfigError
from skyward_iac.api.options import Options, SelectionStrategy
from skyward_iac.api.runtime import AcceleratorInfo, InstanceInfo, PeerInfo
from skyward_iac.api.spec import Spec, validated
from skyward_iac.api.volumes import volume_keys
from skyward_iac.collections import BackendConfig
from skyward_iac.infra.capacity import offers, policy
from skyward_iac.infra.capacity.offers import Offer
from skyward_iac.infra.programs import ClusterRequest, program_for
from skyward_iac.infra.stacks.stack import new_stack_name
from skyward_iac.orchestration import reviewed, warm
from skyward_iac.outputs import ClusterOutputs, NodeAddress
from skyward_iac.plugins import _client as plugins
from skyward_iac.remote import container
from skyward_iac.remote.bootstrap import BootstrapPlan
from skyward_iac.remote.includes import IncludesArchive, build_archive
from skyward_iac.remote.shared_buffers import client_budget
from skyward_iac.remote.volumes import mount_plan

#: The head's coordination port (etcd's client port on the head node).
HEAD_PORT = 2379


def resolve_spec(specs: tuple[Spec, ...], name: str | None, fields: dict[str, Any],
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


@dataclass(frozen=True, slots=True)
class Bounds:
    """How many nodes a pool wants now, and the range autoscaling and resizes move within."""

    desired: int
    floor: int
    ceiling: int

    @classmethod
    def of(cls, spec: Spec) -> Bounds:
        nodes = spec.nodes
        return cls(nodes.desired, nodes.min or nodes.desired,
                   max(nodes.max or nodes.desired, nodes.desired))

    @property
    def elastic(self) -> bool:
        """Whether autoscaling may move the count (a range to move within)."""
        return self.ceiling > self.floor

    @property
    def ready_at(self) -> int:
        """Nodes that must be in service before the pool is handed over (``Nodes.min``)."""
        return min(self.floor, self.desired)


@dataclass(frozen=True)
class PoolPlan:
    """A pool decided but not provisioned: its spec (plugins applied), offer, stack name and
    request, and how each node is bootstrapped and told its place."""

    spec: Spec
    options: Options
    choice: offers.Choice
    stack_name: str
    request: ClusterRequest
    bounds: Bounds
    #: Plugins' named bootstrap steps and node-side hooks, decided once.
    plugin_steps: tuple[tuple[str, str], ...] = ()
    node_plugins: bytes | None = None
    #: The Image's includes packed once: every node, late or replacement, gets the same code.
    includes: IncludesArchive | None = field(default=None, repr=False)

    #: The other Specs of a multi-spec Compute at their best offers (plugins applied), in
    #: the order capacity failover tries them after this one's zones and regions.
    fallbacks: tuple[offers.Choice, ...] = ()
    #: The reviewed plan this pool brings up (``Options(plan=...)``), None for a new stack.
    reviewed: Any = None

    #: The name this run's collections and ``instance_info().job_id`` go by (a warm pool's
    #: stack outlives its runs, each of which starts with empty collections).
    run_id: str = ""

    @property
    def provider(self) -> str:
        return self.spec.provider.kind

    @functools.cached_property
    def warm_key(self) -> str:
        """Equal for two pools whose nodes are interchangeable (see ``warm.py``)."""
        spec = self.spec
        try:
            described: Any = spec.model_dump(mode="json", exclude={"plugins", "volumes"})
        except Exception:  # noqa: BLE001 - a field pydantic cannot render as JSON
            described = repr(spec.model_copy(update={"plugins": (), "volumes": ()}))
        return warm.warm_key({
            "spec": described,
            "volumes": [(v.bucket, v.mount, v.prefix, v.read_only) for v in spec.volumes],
            "plugins": [getattr(p, "name", repr(p)) for p in spec.plugins],
            "node_plugins": hashlib.sha256(self.node_plugins or b"").hexdigest(),
            "plugin_steps": self.plugin_steps,
            "includes": hashlib.sha256(self.includes.data).hexdigest() if self.includes else None,
            "offer": (self.choice.offer.instance_type, self.choice.offer.region,
                      self.choice.market),
            "worker": self.options.worker.model_dump(mode="json"),
            "collections": self.options.collections,
            "skyward": warm.package_digest(),
        })

    def adopting(self, stack: str, node_count: int, on_demand: tuple[int, ...]) -> PoolPlan:
        """This plan for a warm pool taken over: its stack, at its size, with a run id of its
        own."""
        request = replace(self.request, stack_name=stack, node_count=node_count,
                          on_demand_nodes=frozenset(on_demand))
        return replace(self, stack_name=stack, request=request,
                       run_id=f"{stack}-{secrets.token_hex(3)}")

    def request_for(self, base: ClusterRequest, node_count: int) -> ClusterRequest:
        """``base`` (the request in force, with any fallback it took) at ``node_count`` nodes."""
        return replace(base, node_count=node_count)

    def moved_to(self, request: ClusterRequest) -> PoolPlan:
        """This plan after capacity failover moved the pool to ``request``: another zone or
        region of the same instance type, or the next Spec (whose choice it takes; the node
        counts stay the ones the pool started with)."""
        assert request.offer is not None
        fallback = next((c for c in self.fallbacks if c.spec is request.spec), None)
        if fallback is not None:
            return replace(self, spec=fallback.spec, choice=fallback,
                           fallbacks=tuple(c for c in self.fallbacks if c is not fallback))
        return replace(self, choice=replace(self.choice, offer=request.offer))

    def bootstrap_plan(self, address: NodeAddress, outputs: ClusterOutputs) -> BootstrapPlan:
        """How to bootstrap ``address``: etcd on the head, this pool's volumes everywhere."""
        from skyward_iac.orchestration.collections import head_etcd_plan, same_host
        from skyward_iac.orchestration.node import plan_for

        region = None if self.spec.provider.on_this_machine else self.choice.offer.region
        volumes = mount_plan(self.spec.volumes, self.provider, outputs.volume_keys, region=region)
        etcd = head_etcd_plan(outputs, local_socket=same_host(self.spec))
        plan = plan_for(address, self.spec, self.options, etcd, volumes,
                        self.includes, outputs.certificates)
        return replace(plan, steps=plan.steps + self.plugin_steps)

    def collections_config(self, outputs: ClusterOutputs) -> BackendConfig:
        """How this pool's tasks reach the head's etcd (on this machine: its unix socket)."""
        from skyward_iac.orchestration.collections import node_config, same_host

        return node_config(outputs, self.run_id, local_socket=same_host(self.spec))

    def instance_infos(self, outputs: ClusterOutputs) -> dict[int, InstanceInfo]:
        """What each declared node's tasks see through ``sky.instance_info()``, by index."""
        peers = [PeerInfo(node=n.index, private_ip=n.private_address, public_ip=n.public_address)
                 for n in outputs.nodes]
        per_node = self.spec.accelerator.count if self.spec.accelerator else 0
        head = outputs.node(0).private_address if outputs.nodes else ""
        accelerator = accelerator_info(None if self.spec.provider.on_this_machine
                                       else self.choice.offer)
        return {
            node.index: InstanceInfo(
                node=node.index, total_nodes=len(outputs.nodes), head_addr=head,
                head_port=HEAD_PORT, job_id=self.run_id, peers=peers,
                accelerators=per_node, total_accelerators=per_node * len(outputs.nodes),
                workers_per_node=plugins.workers_per_node(self.spec.plugins),
                accelerator=accelerator,
            )
            for node in outputs.nodes
        }

    def usd_per_hour(self, request: ClusterRequest) -> float:
        """The estimated USD/hour of the nodes ``request`` declares, each at its market's price
        (nodes the spot fallback moved on demand at the on-demand one), in the region the
        request is in (capacity failover may have moved it)."""
        choice = self.choice if request.offer is None else replace(self.choice,
                                                                    offer=request.offer)
        try:
            return offers.hourly_cost(choice, request.node_count, request.on_demand_nodes)
        except Exception:  # noqa: BLE001 - an estimate only
            return 0.0


def plan_pool(specs: Sequence[Spec], name: str | None, options: Options | None,
              fields: dict[str, Any]) -> PoolPlan:
    """Validate a ``sky.Compute(...)`` call and decide its pool; ``ConfigError`` (or a plugin's
    ``PluginError``) on bad input, before anything is provisioned."""
    if options is not None and not isinstance(options, Options):
        raise ConfigError(f"options must be sky.Options(...), got {type(options).__name__}")
    options = options or Options()
    choice = resolve_spec(tuple(specs), name, fields, options.selection)
    spec = choice.spec
    _check_local_container(spec)
    _check_budget(spec, options)
    nodes = spec.nodes.desired
    stack_name = new_stack_name(spec)
    # Plugins edit the image and name their bootstrap steps now: a failing hook (named in the
    # PluginError) stops the pool before anything is provisioned.
    spec = plugins.transformed_spec(spec, stack_name, nodes)
    steps = plugins.bootstrap_steps(spec, stack_name, nodes)
    plugins.check_workers(spec.plugins, options.worker)
    # Keys given as callables are resolved once, here; the stack keeps them as secrets.
    bounds = Bounds.of(spec)
    # Frozen once per stack: the creation time (tags) and the pool's maximum (placement), so
    # that no later resize or fallback rebuild changes a running node's inputs.
    request = ClusterRequest(stack_name, spec, nodes, volume_keys=volume_keys(spec.volumes,
                                                                             spec.provider.kind),
                             offer=choice.offer, collections=options.collections,
                             created_at=datetime.now(UTC), max_nodes=bounds.ceiling,
                             max_lifetime=options.max_lifetime, tags=dict(options.tags))
    _check_policy(spec, options, choice, bounds)
    program_for(request)  # an unsupported provider fails here, before provisioning
    client_budget()  # and a SKYWARD_SHARED_BUDGET that is not a number of bytes
    fallbacks = _fallbacks(tuple(specs), choice, options, stack_name)
    plan = PoolPlan(spec=spec, options=options, choice=choice, stack_name=stack_name,
                    request=request, bounds=bounds, run_id=stack_name,
                    plugin_steps=steps,
                    node_plugins=plugins.node_plugins(spec.plugins),
                    includes=_includes(spec), fallbacks=fallbacks)
    if options.plan is not None:
        plan = reviewed.bind(plan, reviewed.load(options.plan))
    return plan


def _fallbacks(specs: tuple[Spec, ...], chosen: offers.Choice, options: Options,
               stack_name: str) -> tuple[offers.Choice, ...]:
    """The other Specs with an offer, in ``Options.selection`` order, that capacity failover
    may move a new pool to: only those with the chosen Spec's plugins (its bootstrap steps
    and hooks are decided once) and within the team policy."""
    if len(specs) < 2:
        return ()
    names = [getattr(p, "name", repr(p)) for p in chosen.spec.plugins]
    found = []
    for choice in offers.ranked(specs, options.selection):
        if choice.spec is chosen.spec or [getattr(p, "name", repr(p))
                                          for p in choice.spec.plugins] != names:
            continue
        spec = plugins.transformed_spec(choice.spec, stack_name, choice.spec.nodes.desired)
        try:
            _check_policy(spec, options, choice, Bounds.of(spec))
        except ConfigError:
            continue
        found.append(replace(choice, spec=spec))
    return tuple(found)


def _check_policy(spec: Spec, options: Options, choice: offers.Choice, bounds: Bounds) -> None:
    """The team's guardrails (``infra/capacity/policy.py``), before anything is provisioned."""
    rules = policy.load()
    if not rules:
        return
    local = spec.provider.on_this_machine  # no catalog offer: no region or instance type
    try:
        usd = offers.hourly_cost(choice, bounds.ceiling)  # a Local node at its usd_per_hour
    except Exception:  # noqa: BLE001 - no price: the cost rule cannot hold it back
        usd = 0.0
    policy.check(rules, policy.PoolFacts(
        provider=spec.provider.kind, region=None if local else choice.offer.region,
        instance_type=None if local else choice.offer.instance_type, usd_per_hour=usd,
        max_nodes=bounds.ceiling, ttl=spec.ttl, max_lifetime=options.max_lifetime,
        tags=options.tags, max_cost_usd=options.max_cost_usd))


def _check_budget(spec: Spec, options: Options) -> None:
    """A budget is kept by the nodes too (their watchdog stops them at its deadline when this
    client is gone), and ``ttl=0`` runs no watchdog: refused rather than half kept."""
    if options.max_cost_usd is not None and spec.ttl == 0:
        raise ConfigError(
            f"Options(max_cost_usd={options.max_cost_usd:g}) needs the nodes' dead-man switch "
            "(Spec ttl > 0): with ttl=0 nothing on the nodes stops them at the budget if this "
            "client dies. Set a ttl (default 600 s), or drop the budget")


def _check_local_container(spec: Spec) -> None:
    """A Local ``container_image`` needs a Docker engine and the image on this machine (a
    Local pool installs and pulls nothing)."""
    image = spec.provider.container_image
    if spec.provider.on_this_machine and image is not None:
        if problem := container.local_engine_problem(image.tag):
            raise ConfigError(f"sky.Local(container_image={image.tag!r}): {problem}; Local "
                              "runs containers only with a Docker engine and the image here")


def _includes(spec: Spec) -> IncludesArchive | None:
    image = spec.image
    return build_archive(image.includes, image.excludes) if image.includes else None


def accelerator_info(offer: Offer | None) -> AcceleratorInfo | None:
    """What ``sky.instance_info().accelerator`` says about a node of ``offer``: the offer's
    accelerator, count and memory; None without one (and on Local, which has none)."""
    if offer is None or not offer.accelerator or not offer.accelerator_count:
        return None
    return AcceleratorInfo(type=offer.accelerator, count=offer.accelerator_count,
                           memory_gb=offer.accelerator_memory_gb,
                           is_trainium=offer.accelerator.lower().startswith("trainium"))
