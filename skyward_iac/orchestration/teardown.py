"""``Teardown``: the steps that end a pool, in the order their parts declare, each run whatever
the others raise.

Every part of a pool registers its stop as it is built, under the ``Phase`` it belongs to; the
teardown runs them phase by phase, whatever order they were built in (within a phase, the
newest first). ``Phase`` is the one place that order is written: what changes the pool stops
before what serves it, the heartbeat before the connections it writes through, the lease and
the destroy last but the console. Each step runs even when an earlier one raised (a dead head,
a cancelled future, a Ctrl+C in the middle), and the *first* error is raised after the last
step, so the stack's destroy is never skipped.
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections.abc import Callable
from typing import Any

from skyward_iac.orchestration.identity import PoolIdentity

log = logging.getLogger("skyward")


class Phase(enum.IntEnum):
    """When a part stops as its pool closes, first to last."""

    #: The client plugins' ``around_client`` exits while the pool still works.
    PLUGINS = 1
    #: The autoscaler, health checks and the budget guard: nothing changes the pool any more.
    WATCHERS = 2
    #: The reconciler: a stack update under way is waited for, none starts.
    UPDATES = 3
    #: Queued calls fail (futures already done or cancelled are left alone).
    CALLS = 4
    #: The client's tunnel to etcd.
    COLLECTIONS = 5
    #: Beats stop while the connections they write through are still open.
    HEARTBEAT = 6
    #: Every node's connections close (volumes unmounted, unless the nodes are kept).
    NODES = 7
    #: The lease is no longer renewed, and this process no longer holds the stack.
    LEASE = 8
    #: The stack's destroy, or the handover of its nodes to a warm pool's keeper.
    STACK = 9
    #: The console, once it has shown the destroy.
    CONSOLE = 10


class Teardown:
    """Named steps run by ``Phase``; see the module doc."""

    def __init__(self, identity: PoolIdentity) -> None:
        self.identity = identity
        self._steps: list[tuple[Phase, int, str, Callable[[], Any]]] = []
        self._added = itertools.count()
        self.errors: list[tuple[str, BaseException]] = []

    def add(self, phase: Phase, name: str, step: Callable[[], Any]) -> None:
        """Run ``step`` in ``phase`` (before the steps of that phase added earlier)."""
        self._steps.append((phase, next(self._added), name, step))

    def take(self, other: Teardown) -> None:
        """Run ``other``'s steps too, each in its phase (``other`` is left empty)."""
        for phase, _, name, step in other._ordered():
            self.add(phase, name, step)
        other._steps = []

    def order(self) -> list[tuple[Phase, str]]:
        """The steps in the order ``run`` runs them."""
        return [(phase, name) for phase, _, name, _ in self._ordered()]

    def _ordered(self) -> list[tuple[Phase, int, str, Callable[[], Any]]]:
        return sorted(self._steps, key=lambda step: (step[0], -step[1]))

    def run(self) -> None:
        """Run every step (see the module doc), then raise the first error, if any."""
        steps, self._steps = self._ordered(), []
        for _, _, name, step in steps:
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - the remaining steps still run
                self.errors.append((name, exc))
                if isinstance(exc, KeyboardInterrupt):  # not a failure: raised again at the end
                    log.warning("stack %s: closing the pool, Ctrl+C during %s",
                                self.identity.stack, name)
                else:
                    log.error("stack %s: closing the pool, %s failed: %s: %s",
                              self.identity.stack, name, type(exc).__name__, exc)
        if self.errors:
            raise self.errors[0][1]
