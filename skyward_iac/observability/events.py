"""What a pool reports while it lives: typed, frozen events, each stamped with a wall-clock time.

Every event names its ``stack`` (one pool is one stack), so one callback can follow several
pools. Node-scoped events carry ``node``, the node's index in the pool. Durations are seconds,
prices USD. Match on them like any dataclass::

    def on_event(event: sky.Event) -> None:
        match event:
            case sky.Metric(node=n, name="cpu", value=v):
                print(f"node {n} cpu {v:.0f}%")
            case sky.TaskCompleted(success=False, error=err):
                print("failed:", err)

Events are plain values: they pickle, compare by value and never hold a secret.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["started", "completed", "failed"]
StackOperation = Literal["up", "destroy", "preview", "refresh"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event; ``timestamp`` is seconds since the epoch (``time.time()``)."""

    timestamp: float = field(default_factory=time.time, compare=False)


# ---- the cluster ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ClusterRequested(Event):
    """A pool was asked for: what will be provisioned and what it costs per hour (all nodes)."""

    stack: str
    provider: str
    nodes: int
    accelerator: str | None = None
    instance_type: str | None = None
    region: str | None = None
    market: str | None = None  # "spot" | "on-demand"; None on Local
    hourly_usd: float = 0.0
    #: ``hourly_usd`` rests on estimated spot prices (the shipped catalog's), not quotes.
    estimated: bool = False


@dataclass(frozen=True, slots=True)
class ClusterProvisioned(Event):
    """``pulumi up`` finished: every node exists; ``duration`` is the up's."""

    stack: str
    nodes: int
    duration: float


@dataclass(frozen=True, slots=True)
class ClusterReady(Event):
    """Every node is bootstrapped and its agent connected; ``duration`` since the request.
    ``adopted``: the nodes are a warm pool's, taken over (no update, no bootstrap)."""

    stack: str
    nodes: int
    duration: float
    hourly_usd: float = 0.0
    adopted: bool = False


@dataclass(frozen=True, slots=True)
class ClusterDestroyed(Event):
    """The stack was destroyed; ``uptime`` from provisioned to destroyed and what it cost.
    For an ``adopted`` warm pool both cover the stack's whole life, its warm time included."""

    stack: str
    duration: float
    uptime: float = 0.0
    cost_usd: float = 0.0
    adopted: bool = False


# ---- instances ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class InstanceLaunched(Event):
    """The engine started creating node ``node``'s instance."""

    stack: str
    node: int
    instance_type: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceProvisioned(Event):
    """Node ``node``'s instance exists (its resource is created); bootstrap comes next."""

    stack: str
    node: int
    instance_id: str = ""
    address: str = ""
    spot: bool = False
    hourly_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class InstanceBootstrapped(Event):
    """Node ``node`` is bootstrapped and its agent answered; ``duration`` of SSH + bootstrap."""

    stack: str
    node: int
    duration: float


@dataclass(frozen=True, slots=True)
class InstancePreempted(Event):
    """The cloud took node ``node`` back (spot interruption) or it stopped answering."""

    stack: str
    node: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ProvisionRetried(Event):
    """The cloud refused a stack update's nodes; it tries again elsewhere (``attempt`` counts
    from 2, up to ``Options(max_provision_attempts)``): ``reason`` is the cloud's error,
    ``region``/``zone`` where the pool goes now, ``why`` what moved (the next zone, region or
    Spec of a new pool, or ``node 1 -> us-east-1b`` / ``node 1 -> on demand``)."""

    stack: str
    attempt: int
    reason: str
    region: str
    zone: str | None = None
    why: str = ""


@dataclass(frozen=True, slots=True)
class InstanceReplaced(Event):
    """Node ``node`` was replaced by a new instance (same index, new ``instance_id``)."""

    stack: str
    node: int
    old_instance_id: str = ""
    instance_id: str = ""


@dataclass(frozen=True, slots=True)
class InstanceDestroyed(Event):
    """Node ``node``'s instance is gone."""

    stack: str
    node: int


# ---- bootstrap ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BootstrapPhase(Event):
    """A bootstrap phase of node ``node`` started, completed or failed.

    ``index``/``total`` place the phase in the node's plan when known (for progress bars);
    ``duration`` is set when it ends; ``detail`` says why it failed.
    """

    stack: str
    node: int
    phase: str
    status: Status
    index: int | None = None
    total: int | None = None
    duration: float | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class BootstrapConsole(Event):
    """One line a bootstrap step printed on node ``node``."""

    stack: str
    node: int
    line: str
    stream: Literal["stdout", "stderr"] = "stdout"


# ---- tasks ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TaskQueued(Event):
    """A call entered the pool's queue; ``node`` is set when it targets one node."""

    stack: str
    task_id: int
    name: str
    node: int | None = None


@dataclass(frozen=True, slots=True)
class TaskStarted(Event):
    """A worker on node ``node`` started the call (a retried call starts again elsewhere)."""

    stack: str
    task_id: int
    name: str
    node: int


@dataclass(frozen=True, slots=True)
class TaskCompleted(Event):
    """A call finished on node ``node``: ``success``, ``duration`` and, on failure, ``error``.

    ``duration`` is how long the function ran on the node; for a call the client failed (its
    timeout, a lost node) how long it was out since it was sent, on the client's clock; 0 when
    it never left the client. ``node`` is -1 for a call that never left the client (the pool
    closed first).
    """

    stack: str
    task_id: int
    name: str
    node: int
    success: bool
    duration: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class TaskProgress(Event):
    """How a pool's calls stand: ``queued`` waiting for a slot, ``running`` handed to a node
    (running there or waiting in its buffer), ``succeeded`` and ``failed`` so far.

    Emitted at most every 0.25 s while calls move, and once more when they stop, so the last
    one is the final state. What consoles show instead of the per-task events.
    """

    stack: str
    queued: int
    running: int
    succeeded: int
    failed: int


# ---- telemetry ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Metric(Event):
    """One sample of a node metric (``sky.metrics``): ``cpu`` 37.5 ``%``.

    ``device`` tells GPUs apart (``gpu`` on device 1); None for node-wide metrics.
    """

    stack: str
    node: int
    name: str
    value: float
    unit: str = ""
    device: int | None = None


@dataclass(frozen=True, slots=True)
class Log(Event):
    """A line of output: a task's stdout/stderr on ``node``, or the engine's (``node`` None)."""

    stack: str
    line: str
    node: int | None = None
    stream: str = "stdout"  # "stdout" | "stderr" | "pulumi"


@dataclass(frozen=True, slots=True)
class Error(Event):
    """Something went wrong; ``fatal`` when the pool cannot go on."""

    stack: str
    message: str
    node: int | None = None
    fatal: bool = False


@dataclass(frozen=True, slots=True)
class CollectionsLost(Error):
    """The pool's distributed collections are gone, with their data: etcd on the head node
    stopped, or the SSH connection to the head was lost. An ``Error`` (not ``fatal``: tasks go
    on), so every console shows ``message``, which says what was lost; collection calls raise
    ``CollectionError`` from then on."""


@dataclass(frozen=True, slots=True)
class BudgetWarning(Error):
    """The pool has spent 80 % of its ``Options(max_cost_usd)`` (``spent_usd`` of
    ``budget_usd``, at ``usd_per_hour`` now). An ``Error`` that is not ``fatal``, so every
    console shows ``message``; once per pool."""

    budget_usd: float = 0.0
    spent_usd: float = 0.0
    usd_per_hour: float = 0.0


@dataclass(frozen=True, slots=True)
class BudgetExceeded(Error):
    """The pool has spent its ``Options(max_cost_usd)``: it is closed and destroyed, its
    pending calls raise ``BudgetExceededError``. A ``fatal`` ``Error``."""

    budget_usd: float = 0.0
    spent_usd: float = 0.0
    usd_per_hour: float = 0.0


# ---- the stack (Pulumi) ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StackProgress(Event):
    """One resource step of a running Pulumi operation, for progress bars.

    ``op`` is the engine's (create, update, delete, same, replace ...); ``status`` whether the
    step just started, completed or failed. ``done``/``started`` count the operation's steps so
    far, ``total`` is known only when a preview counted them first.
    """

    stack: str
    operation: StackOperation
    name: str
    type: str
    op: str
    status: Status
    done: int
    started: int
    total: int | None = None


@dataclass(frozen=True, slots=True)
class StackChanges(Event):
    """A stack operation finished: resources per operation (``{"create": 3, "same": 1}``)."""

    stack: str
    changes: Mapping[str, int]
    duration: float = 0.0

    @property
    def resources(self) -> int:
        """How many resources the stack holds (or would hold) afterwards: all but deletes."""
        return sum(n for op, n in self.changes.items() if op != "delete")


@dataclass(frozen=True, slots=True)
class StackPreviewed(StackChanges):
    """A preview finished: what an ``up`` would change."""


@dataclass(frozen=True, slots=True)
class StackUpdated(StackChanges):
    """An ``up`` finished: what it changed."""


@dataclass(frozen=True, slots=True)
class StackDestroyed(Event):
    """A ``destroy`` finished; ``deleted`` resources, ``changes`` as the engine counted them."""

    stack: str
    deleted: int
    changes: Mapping[str, int] = field(default_factory=dict)
    duration: float = 0.0


#: Every concrete event class, for ``sky`` re-exports and documentation.
EVENT_TYPES: tuple[type[Event], ...] = (
    ClusterRequested, ClusterProvisioned, ClusterReady, ClusterDestroyed,
    InstanceLaunched, InstanceProvisioned, InstanceBootstrapped, InstancePreempted,
    ProvisionRetried, InstanceReplaced, InstanceDestroyed, BootstrapPhase, BootstrapConsole,
    TaskQueued, TaskStarted, TaskCompleted, TaskProgress, Metric, Log, Error, CollectionsLost,
    BudgetWarning, BudgetExceeded, StackProgress, StackPreviewed, StackUpdated, StackDestroyed,
)

__all__ = [
    "EVENT_TYPES", "Event", "StackOperation", "Status",
    "ClusterRequested", "ClusterProvisioned", "ClusterReady", "ClusterDestroyed",
    "InstanceLaunched", "InstanceProvisioned", "InstanceBootstrapped", "InstancePreempted",
    "ProvisionRetried", "InstanceReplaced", "InstanceDestroyed", "BootstrapPhase", "BootstrapConsole", "TaskQueued",
    "TaskStarted", "TaskCompleted", "TaskProgress", "Metric", "Log", "Error", "CollectionsLost",
    "BudgetWarning", "BudgetExceeded", "StackProgress", "StackChanges", "StackPreviewed",
    "StackUpdated", "StackDestroyed",
]
