"""What a console knows about each pool, folded from its events; pure state, no I/O.

``PoolView.apply(event)`` updates it; renderers read it. Kept apart from the renderers so the
bookkeeping (progress fractions, task counts, cost so far) is tested without a terminal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from skyward_iac.observability.events import (
    BootstrapConsole,
    BootstrapPhase,
    ClusterDestroyed,
    ClusterProvisioned,
    ClusterReady,
    ClusterRequested,
    Error,
    Event,
    InstanceBootstrapped,
    InstanceDestroyed,
    InstanceLaunched,
    InstancePreempted,
    InstanceProvisioned,
    InstanceReplaced,
    Metric,
    StackDestroyed,
    StackPreviewed,
    StackProgress,
    StackUpdated,
    TaskProgress,
)

#: Share of a node's bar reached at each stage before bootstrap phases fill the rest.
_LAUNCHED, _PROVISIONED = 0.1, 0.25


@dataclass
class NodeView:
    """One node: where it is in provisioning/bootstrap and its latest metrics."""

    index: int
    status: str = "waiting"  # waiting, launching, provisioned, bootstrapping, ready, failed, gone
    phase: str = ""
    phases_done: int = 0
    phases_total: int | None = None
    last_line: str = ""
    #: Latest value per metric name; GPU metrics averaged over devices.
    metrics: dict[str, float] = field(default_factory=dict)
    _devices: dict[tuple[str, int], float] = field(default_factory=dict)

    @property
    def progress(self) -> float:
        """0..1 along launch -> provision -> bootstrap phases -> ready."""
        if self.status in ("ready", "gone"):
            return 1.0
        if self.status == "launching":
            return _LAUNCHED
        if self.status == "provisioned":
            return _PROVISIONED
        if self.status in ("bootstrapping", "failed"):
            total = self.phases_total or max(self.phases_done + 1, 1)
            return _PROVISIONED + (1 - _PROVISIONED) * min(self.phases_done / total, 0.99)
        return 0.0

    def record(self, metric: Metric) -> None:
        if metric.device is None:
            self.metrics[metric.name] = metric.value
            return
        self._devices[(metric.name, metric.device)] = metric.value
        values = [v for (name, _), v in self._devices.items() if name == metric.name]
        self.metrics[metric.name] = sum(values) / len(values)


@dataclass
class StackView:
    """One pool (one stack): request, engine progress, nodes, tasks and cost."""

    stack: str
    provider: str = ""
    instance_type: str | None = None
    accelerator: str | None = None
    market: str | None = None
    wanted: int = 0
    hourly_usd: float = 0.0
    state: str = "requested"  # requested, provisioning, bootstrapping, ready, destroying, destroyed
    requested_at: float = field(default_factory=time.time)
    billing_since: float | None = None
    ended_at: float | None = None
    operation: str = ""
    steps_done: int = 0
    steps_started: int = 0
    steps_total: int | None = None
    last_resource: str = ""
    resources: int | None = None
    #: Resource counts per operation of the last finished Pulumi operation.
    changes: dict[str, int] = field(default_factory=dict)
    nodes: dict[int, NodeView] = field(default_factory=dict)
    #: Task counts, from the pool's latest ``TaskProgress``.
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def node(self, index: int) -> NodeView:
        """The view of node ``index``, created on first mention."""
        if index not in self.nodes:
            self.nodes[index] = NodeView(index)
        return self.nodes[index]

    @property
    def ready_nodes(self) -> int:
        """Nodes whose agent is up."""
        return sum(1 for n in self.nodes.values() if n.status == "ready")

    def cost(self, now: float | None = None) -> float:
        """USD spent so far: the hourly price since the first instance launched."""
        if self.billing_since is None:
            return 0.0
        end = self.ended_at or (now if now is not None else time.time())
        return self.hourly_usd * max(0.0, end - self.billing_since) / 3600

    def elapsed(self, now: float | None = None) -> float:
        """Seconds since the pool was requested (until it was destroyed)."""
        end = self.ended_at or (now if now is not None else time.time())
        return max(0.0, end - self.requested_at)


class PoolView:
    """Every pool a console has heard of, by stack name."""

    def __init__(self) -> None:
        self.stacks: dict[str, StackView] = {}

    def stack(self, name: str, at: float | None = None) -> StackView:
        """The view of stack ``name``, created on first mention."""
        if name not in self.stacks:
            self.stacks[name] = StackView(name, requested_at=at or time.time())
        return self.stacks[name]

    def active(self) -> list[StackView]:
        """Pools not destroyed yet, oldest first."""
        return [s for s in self.stacks.values() if s.state != "destroyed"]

    def apply(self, event: Event) -> StackView | None:  # noqa: C901 - one case per event type
        """Fold ``event`` into the view; returns the stack it touched."""
        name = getattr(event, "stack", None)
        if not isinstance(name, str):
            return None
        view = self.stack(name, event.timestamp)
        match event:
            case TaskProgress():
                view.queued, view.running = event.queued, event.running
                view.succeeded, view.failed = event.succeeded, event.failed
            case ClusterRequested():
                view.requested_at, view.provider = event.timestamp, event.provider
                view.instance_type, view.accelerator = event.instance_type, event.accelerator
                view.market, view.wanted, view.hourly_usd = event.market, event.nodes, \
                    event.hourly_usd
                view.state = "provisioning"
                for index in range(event.nodes):
                    view.node(index)
            case StackProgress():
                view.operation, view.steps_total = event.operation, event.total
                view.steps_done, view.steps_started = event.done, event.started
                view.last_resource = event.name
                if event.operation == "destroy":
                    view.state = "destroying"
            case StackUpdated() | StackPreviewed():
                view.steps_done = view.steps_started
                view.resources, view.changes = event.resources, dict(event.changes)
            case StackDestroyed():
                view.steps_done, view.resources = view.steps_started, 0
                view.changes = dict(event.changes) or {"delete": event.deleted}
            case ClusterProvisioned():
                view.state = "bootstrapping"
                view.billing_since = view.billing_since or event.timestamp
            case InstanceLaunched():
                view.node(event.node).status = "launching"
                view.billing_since = view.billing_since or event.timestamp
            case InstanceProvisioned():
                view.node(event.node).status = "provisioned"
            case BootstrapPhase():
                self._phase(view.node(event.node), event)
            case BootstrapConsole():
                view.node(event.node).last_line = event.line
            case InstanceBootstrapped():
                node = view.node(event.node)
                node.status, node.phase = "ready", ""
            case ClusterReady():
                view.state, view.hourly_usd = "ready", event.hourly_usd or view.hourly_usd
            case InstancePreempted():
                view.node(event.node).status = "failed"
            case InstanceReplaced():
                view.node(event.node).status = "launching"
            case InstanceDestroyed():
                view.node(event.node).status = "gone"
            case Metric():
                view.node(event.node).record(event)
            case Error():
                view.errors.append(event.message)
            case ClusterDestroyed():
                view.state, view.ended_at = "destroyed", event.timestamp
        return view

    @staticmethod
    def _phase(node: NodeView, event: BootstrapPhase) -> None:
        node.phase = event.phase
        if event.total is not None:
            node.phases_total = event.total
        if event.status == "started":
            node.status = "bootstrapping"
        elif event.status == "completed":
            node.phases_done = event.index + 1 if event.index is not None \
                else node.phases_done + 1
        else:
            node.status = "failed"
