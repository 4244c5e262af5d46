"""The autoscaling policy of an elastic pool: a pure function from what the pool sees to how
many nodes it should have. ``Compute`` samples the pool, asks, and actuates by stack update."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
