"""Who is in a pool: the declared node set, the live one, and the step that converges them.

``Membership`` is the one owner of a pool's nodes: the desired count and its bounds, the
count the stack declares, and each node's phase (joining, ready, lost, leaving, failed).
Resizes, lost connections, failed health checks, preemption notices and the autoscaler only
change this declared state; the reconciler (``reconciler.py``) brings reality to it one
``ConvergeStep`` at a time. ``converge_step`` is the pure decision.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.retry import RetryPolicy
from skyward_iac.api.spec import MAX_NODES
from skyward_iac.orchestration.node import Node
from skyward_iac.orchestration.plan import Bounds


class Phase(enum.Enum):
    """Where a declared node is in its life."""

    JOINING = "joining"    # declared; being connected and bootstrapped
    READY = "ready"        # in service
    LOST = "lost"          # out of service; to be recreated (after ``retry_at``)
    LEAVING = "leaving"    # being drained before a shrink removes it
    FAILED = "failed"      # gave up recreating it (see ``reason``)


@dataclass
class Member:
    """One declared node index and what is known of it."""

    index: int
    phase: Phase
    node: Node | None = None
    reason: str = ""
    #: Consecutive failed starts, and when the next may be tried (monotonic).
    failures: int = 0
    retry_at: float = 0.0


@dataclass(frozen=True, slots=True)
class ConvergeStep:
    """One stack update and what comes with it: drain ``retire`` first, declare
    ``node_count`` nodes recreating ``replace``, then bootstrap ``start``."""

    node_count: int
    start: tuple[int, ...] = ()
    replace: tuple[int, ...] = ()
    retire: tuple[int, ...] = ()

    def describe(self, declared: int) -> str:
        """The stack-history message of this update."""
        if declared == 0:
            return f"skyward: bring up {self.node_count} node(s)"
        parts = []
        if self.node_count != declared:
            parts.append(f"resize {declared} -> {self.node_count} nodes")
        if self.replace:
            parts.append(f"replace node(s) {', '.join(map(str, self.replace))}")
        return "skyward: " + ("; ".join(parts) or "converge")


def converge_step(declared: int, desired: int, members: Mapping[int, tuple[Phase, float]],
                  now: float) -> ConvergeStep | None:
    """The next step from ``declared`` nodes to ``desired``, or None when there is nothing to
    do now. ``members`` maps each declared index to its phase and ``retry_at``: lost nodes
    below the new count are recreated once their ``retry_at`` has passed; nodes at or above
    it are retired; new indexes are started. Joining, ready and failed nodes stay as they are.
    """
    retire = tuple(range(desired, declared))
    due = tuple(sorted(i for i, (phase, retry_at) in members.items()
                       if i < min(declared, desired) and phase is Phase.LOST and retry_at <= now))
    new = tuple(range(declared, desired))
    if not (retire or due or new):
        return None
    return ConvergeStep(node_count=desired, start=due + new, replace=due, retire=retire)


def next_retry(members: Mapping[int, tuple[Phase, float]], declared: int, desired: int) -> float | None:
    """When the earliest lost node below the target may be recreated (None: none waits)."""
    waits = [retry_at for i, (phase, retry_at) in members.items()
             if phase is Phase.LOST and i < min(declared, desired)]
    return min(waits) if waits else None


def check_target(desired: int, floor: int, ceiling: int) -> None:
    """``ConfigError`` unless ``floor <= desired <= ceiling`` within ``1..MAX_NODES``."""
    if not (1 <= floor <= desired <= ceiling <= MAX_NODES):
        raise ConfigError(
            f"a pool's node count must satisfy 1 <= min ({floor}) <= desired ({desired}) <= "
            f"max ({ceiling}) <= {MAX_NODES}")


class Membership:
    """The pool's declared and live node sets (thread-safe); see the module doc.

    ``on_service(nodes)`` is called with the nodes in service (index order) after every
    change of that set; ``on_change()`` after every change of the declared state.
    """

    def __init__(self, bounds: Bounds, on_service: Callable[[tuple[Node, ...]], Any],
                 on_change: Callable[[], Any]) -> None:
        self.desired, self.floor, self.ceiling = bounds.desired, bounds.floor, bounds.ceiling
        #: Nodes the stack declares (after the last successful update).
        self.declared = 0
        self._members: dict[int, Member] = {}
        self._cond = threading.Condition()
        self._on_service = on_service
        self._on_change = on_change
        #: Set when the pool can no longer change (closing, or the stack was taken down).
        self.stopped: str | None = None

    # ---- reading ---------------------------------------------------------------------------

    def in_service(self) -> tuple[Node, ...]:
        """Ready nodes, by index."""
        with self._cond:
            return self._service()

    def _service(self) -> tuple[Node, ...]:
        return tuple(m.node for _, m in sorted(self._members.items())
                     if m.phase is Phase.READY and m.node is not None)

    def ready_count(self) -> int:
        with self._cond:
            return sum(1 for m in self._members.values() if m.phase is Phase.READY)

    def phases(self) -> dict[int, tuple[Phase, float]]:
        """Each declared index's phase and ``retry_at`` (a snapshot, for planning)."""
        with self._cond:
            return {i: (m.phase, m.retry_at) for i, m in self._members.items()}

    def member(self, index: int) -> Member | None:
        with self._cond:
            return self._members.get(index)

    def nodes(self) -> list[Node]:
        """Every connected node (ready or leaving), e.g. to close them."""
        with self._cond:
            return [m.node for m in self._members.values() if m.node is not None]

    # ---- the declared state ------------------------------------------------------------------

    def set_target(self, desired: int, floor: int | None = None,
                   ceiling: int | None = None) -> None:
        """Want ``desired`` nodes from now on (and new bounds, when given)."""
        with self._cond:
            floor = self.floor if floor is None else floor
            ceiling = self.ceiling if ceiling is None else ceiling
            check_target(desired, floor, ceiling)
            self.desired, self.floor, self.ceiling = desired, floor, ceiling
            # A new target is a new chance for nodes that failed to start.
            for member in self._members.values():
                if member.phase is Phase.FAILED:
                    member.phase, member.failures, member.retry_at = Phase.LOST, 0, 0.0
            self._changed()

    def lose(self, index: int, reason: str) -> Node | None:
        """Node ``index`` is out of service (connection lost, unhealthy, preempted): it is to
        be recreated. Returns its node if it was connected (to fence and close), else None."""
        with self._cond:
            member = self._members.get(index)
            if self.stopped or member is None or member.phase in (Phase.LOST, Phase.FAILED):
                return None
            node, member.node = member.node, None
            member.phase, member.reason = Phase.LOST, reason
            member.retry_at = 0.0  # recreate it at once
            if node is not None:
                self._on_service(self._service())
            self._changed()
            return node

    def stop(self, reason: str) -> None:
        """No more changes: the pool is closing, or its stack was taken down."""
        with self._cond:
            if self.stopped is None:
                self.stopped = reason
            self._cond.notify_all()

    # ---- what the reconciler reports --------------------------------------------------------

    def leaving(self, indexes: tuple[int, ...]) -> list[Node]:
        """Take ``indexes`` out of service before they are removed; returns their nodes."""
        with self._cond:
            nodes = []
            for index in indexes:
                member = self._members.get(index)
                if member is None:
                    continue
                member.phase = Phase.LEAVING
                if member.node is not None:
                    nodes.append(member.node)
            self._on_service(self._service())
            self._cond.notify_all()
            return nodes

    def declared_now(self, node_count: int, joining: tuple[int, ...]) -> list[Node]:
        """The stack declares ``node_count`` nodes now and ``joining`` are being started;
        returns the nodes of removed indexes (to close)."""
        with self._cond:
            self.declared = node_count
            removed = [self._members.pop(i) for i in list(self._members) if i >= node_count]
            for index in joining:
                member = self._members.setdefault(index, Member(index, Phase.JOINING))
                member.phase, member.node = Phase.JOINING, None
            self._cond.notify_all()
            return [m.node for m in removed if m.node is not None]

    def joined(self, index: int, node: Node) -> bool:
        """Node ``index`` is ready; False when it is no longer wanted (the caller closes it)."""
        with self._cond:
            member = self._members.get(index)
            if self.stopped or member is None or member.phase is not Phase.JOINING:
                return False
            member.phase, member.node, member.failures, member.reason = Phase.READY, node, 0, ""
            self._on_service(self._service())
            self._cond.notify_all()
            return True

    def start_failed(self, index: int, error: str, policy: RetryPolicy) -> bool:
        """Starting node ``index`` failed; it is retried after ``policy``'s delay, or given up
        once ``policy`` allows no further attempt (True then): ``api/retry.for_node_start``."""
        with self._cond:
            member = self._members.get(index)
            if member is None or member.phase is not Phase.JOINING:
                return False
            member.failures += 1
            member.reason = error
            gave_up = not policy.allows(member.failures + 1)
            member.phase = Phase.FAILED if gave_up else Phase.LOST
            member.retry_at = time.monotonic() + policy.delay_before(member.failures + 1)
            self._changed()
            return gave_up

    # ---- waiting -----------------------------------------------------------------------------

    def wait_ready(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` nodes are ready (True); False as soon as so many starts failed
        that ``count`` cannot be reached, the pool stopped, or ``timeout`` passed. Wakes at
        least every second, so Ctrl+C reaches the waiting thread."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                members = self._members.values()
                ready = sum(1 for m in members if m.phase is Phase.READY)
                if ready >= count:
                    return True
                left = deadline - time.monotonic()
                if self.stopped or not self._reachable(count) or left <= 0:
                    return False
                self._cond.wait(min(1.0, left))

    def can_reach(self, count: int) -> bool:
        """Whether ``count`` nodes may still be ready without a node that failed to start
        (what ``wait_ready`` waits for: a pool's first start gives up on any failure)."""
        with self._cond:
            return self._reachable(count)

    def _reachable(self, count: int) -> bool:
        failed = sum(1 for m in self._members.values()
                     if m.failures and m.phase is not Phase.READY)
        return len(self._members) - failed >= count

    def wait_settled(self, timeout: float) -> bool:
        """Wait until the stack declares the desired count and every node is ready or given
        up (True), the pool stopped or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                settled = self.declared == self.desired and all(
                    m.phase in (Phase.READY, Phase.FAILED) for m in self._members.values())
                if settled:
                    return True
                left = deadline - time.monotonic()
                if self.stopped or left <= 0:
                    return False
                self._cond.wait(min(1.0, left))

    def failures(self) -> dict[int, str]:
        """Why each node that is not ready is not (for errors)."""
        with self._cond:
            return {i: m.reason for i, m in sorted(self._members.items())
                    if m.phase is not Phase.READY and m.reason}

    def _changed(self) -> None:
        self._cond.notify_all()
        self._on_change()
