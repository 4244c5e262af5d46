"""The autoscaling of an elastic pool: ``desired_nodes``, a pure function from what the pool
sees to how many nodes it should have, and ``Autoscaler``, the thread that samples the pool,
asks, and sets the membership's target (the reconciler does the rest)."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyward_iac.api.options import Options
    from skyward_iac.orchestration.dispatch import Dispatcher
    from skyward_iac.orchestration.membership import Membership

log = logging.getLogger("skyward")


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """One sample of an elastic pool."""

    nodes: int            # nodes in service now
    queued: int           # calls waiting for a slot
    running: int          # calls on nodes
    slots_per_node: int   # concurrency + buffer
    floor: int            # never fewer nodes (Nodes.min, else desired)
    ceiling: int          # never more (Nodes.max)


def desired_nodes(load: PoolLoad, *, now: float, last_change: float, idle_since: float | None,
                  cooldown: float, idle_timeout: float) -> int:
    """How many nodes the pool should have.

    Grow at once to the nodes the pending work fills (up to the ceiling); shrink to the floor
    only after the pool has been idle for ``idle_timeout``; never change twice within
    ``cooldown`` seconds, so a scale step settles before the next decision.
    """
    if now - last_change < cooldown:
        return load.nodes
    demand = math.ceil((load.queued + load.running) / max(1, load.slots_per_node))
    if demand > load.nodes:
        return min(load.ceiling, demand)
    idle = load.queued == 0 and load.running == 0
    if idle and idle_since is not None and now - idle_since >= idle_timeout:
        return max(load.floor, min(load.nodes, demand))
    return load.nodes


class Autoscaler:
    """Samples an elastic pool every ``reconcile_tick_interval`` seconds and moves its target
    between the membership's bounds (read at every tick: a resize may change them)."""

    def __init__(self, dispatcher: Dispatcher, membership: Membership, options: Options) -> None:
        self.dispatcher = dispatcher
        self.membership = membership
        self.options = options
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skyward-autoscaler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_change, idle_since = time.monotonic(), None
        options = self.options
        while not self._stopped.wait(options.reconcile_tick_interval):
            membership = self.membership
            if membership.stopped:
                return
            if membership.declared != membership.desired:
                continue  # the last change is still under way
            queued, running = self.dispatcher.load()
            now = time.monotonic()
            idle_since = (idle_since or now) if queued == running == 0 else None
            load = PoolLoad(membership.desired, queued, running, self.dispatcher.slots_per_node,
                            membership.floor, membership.ceiling)
            target = desired_nodes(load, now=now, last_change=last_change, idle_since=idle_since,
                                   cooldown=options.autoscale_cooldown,
                                   idle_timeout=options.autoscale_idle_timeout)
            if target != load.nodes:
                log.info("autoscaling from %d to %d node(s) (%d queued, %d running)",
                         load.nodes, target, queued, running)
                try:
                    membership.set_target(target)
                except Exception as exc:  # noqa: BLE001 - bounds moved meanwhile; next tick
                    log.warning("autoscaling to %d refused: %s", target, exc)
                last_change, idle_since = time.monotonic(), None

    def stop(self) -> None:
        """Stop scaling (the pool is closing)."""
        self._stopped.set()
